"""A serving cache of processed weights in ckptd (sharded, fused, quantized tensors).

    import ckpt, ckpt.serving_cache as sc
    client = ckpt.connect()
    entry = sc.get_or_build(client, "llama-70b", build, rank=rank, world=world,
                            layout={"tp": world, "ep": 1}, dtype="fp8_e4m3", quantization="fp8-per-channel",
                            user_key="vllm-0.9 fused-qkv")
    model.load_state_dict(entry.tensors, strict=False)   # zero-copy CPU views of shared memory

`build(source: ckpt.Checkpoint, rank, world) -> {name: tensor}` computes the rank's
processed tensors from the attached source checkpoint (it is called only on a miss).

What the name encodes. Every cached entry is one generation named
``u<uid>.<prefix>-<source>-g<generation>-<digest>-r<rank>of<world>`` where uid is the
publisher's and digest is the SHA-256 (first 16 hex digits) of a canonical JSON "key"
holding: the publisher's uid, the source checkpoint's name,
its generation (unless match_generation=False) and its content checksum (a digest of
every tensor's name, dtype, shape and XXH3 from the attachment's index, and its side
files), the layout (TP/EP/PP degrees, anything JSON), dtype, quantization, library
versions (torch's by default, plus what `versions` adds) and the caller's `user_key`.
The key is also stored with the entry (side file ``serving_cache.json``) and compared in
full on a hit, so a digest collision or a hand-made entry under that name is a miss.

Who may be trusted. Everything in the key is public, so the key alone proves nothing about
who published an entry. ckptd reserves the names ``u<uid>.*`` for that uid (and admins:
docs/operations.md, *Ownership*), records the owner of every generation in its segment,
and only the owner or an admin may replace it. A hit is therefore taken only on an entry
whose daemon-recorded owner (``Checkpoint.owner_uid``) is the publisher its name and key
name: the caller itself (``os.geteuid()``) or one of `trusted_uids` (default: the uids in
``$CKPT_CACHE_TRUSTED_UIDS``, comma-separated), looked up in that order. Entries of anyone
else, even with the right key, are never used; this process publishes only its own.

Concurrency. Each rank caches its own tensors under its own name (rank and world in the
name): ranks never wait for each other, a rank that misses builds only its part, and an
entry is published whole or not at all. Two processes racing for the same rank's entry
both build; the first publish wins, the second gets AlreadyExists and attaches the
winner's entry (its own result is dropped): while the winner is still writing, it waits
for the entry (up to `timeout`), and if the winner's write fails it publishes its own.

Staleness. A new generation of the source, other content, another layout, dtype,
quantization or library version gives another name: old entries simply stop matching.
`evict_stale(client)` removes entries whose source is gone or has changed (the daemon's
budget can evict them as well; attached entries are kept unless force=True).
"""
import hashlib
import json
import os
import re
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import torch

import ckpt

__all__ = ["CacheEntry", "cache_key", "cache_name", "source_checksum", "get_or_build", "evict_stale", "KEY_FILE",
           "trusted_uids"]

KEY_FILE = "serving_cache.json"
_NAME_BAD = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass
class CacheEntry:
    """A rank's processed tensors, attached from ckptd. `tensors` are read-only zero-copy
    CPU views (or copies on `device`), valid as long as the entry (or any of them) lives."""
    name: str
    hit: bool                      # True: attached an existing entry; False: built and published now
    checkpoint: "ckpt.Checkpoint"  # the attached cache generation
    tensors: Dict[str, torch.Tensor]
    key: Dict[str, Any]


def source_checksum(source: "ckpt.Checkpoint") -> str:
    """A digest (SHA-256, hex) of the source generation's content as its index records it:
    every tensor's name, dtype, shape and XXH3-64, and every side file's bytes."""
    h = hashlib.sha256()
    for name in sorted(source.keys()):
        info = source.info(name)
        h.update(json.dumps([name, info["dtype"], list(info["shape"]), int(info["checksum"])]).encode())
    for f in source.side_files:
        h.update(b"side:" + f.encode() + b"\0")
        h.update(hashlib.sha256(source.side_file(f)).digest())
    return h.hexdigest()


def cache_key(source: "ckpt.Checkpoint", *, rank: int = 0, world: int = 1, layout: Any = None,
              dtype: Any = None, quantization: Any = None, versions: Optional[Mapping[str, str]] = None,
              user_key: Any = None, match_generation: bool = True,
              publisher: Optional[int] = None) -> Dict[str, Any]:
    """The key (a JSON-able dict) of a rank's entry published by uid `publisher` (default:
    this process's effective uid); see the module's docstring."""
    v = {"torch": torch.__version__}
    v.update(dict(versions or {}))
    key = {
        "publisher": int(os.geteuid() if publisher is None else publisher),
        "source": source.name,
        "generation": int(source.generation) if match_generation else None,
        "checksum": source_checksum(source),
        "rank": int(rank), "world": int(world),
        "layout": layout,
        "dtype": str(dtype) if dtype is not None else None,
        "quantization": quantization,
        "versions": v,
        "user_key": user_key,
    }
    json.dumps(key)  # raises TypeError for a part that is not JSON
    return key


def cache_name(key: Mapping[str, Any], prefix: str = "cache") -> str:
    """The checkpoint name of `key`: in its publisher's reserved name space ``u<uid>.``
    (letters, digits, '_', '-', '.'; at most 100 characters)."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    gen = "x" if key.get("generation") is None else str(key["generation"])
    tail = "-g%s-%s-r%dof%d" % (gen, digest, key["rank"], key["world"])
    space = "u%d." % int(key["publisher"])
    head = space + _NAME_BAD.sub("_", "%s-%s" % (prefix, key["source"]))
    return head[:100 - len(tail)] + tail


def trusted_uids(trusted: Optional[Sequence[int]] = None) -> List[int]:
    """The uids whose entries a lookup may take besides this process's own: `trusted`, or
    the comma-separated uids of $CKPT_CACHE_TRUSTED_UIDS (empty: none)."""
    if trusted is None:
        text = os.environ.get("CKPT_CACHE_TRUSTED_UIDS", "")
        trusted = [int(u) for u in text.replace(" ", "").split(",") if u]
    return [int(u) for u in trusted]


def _stored_key(c: "ckpt.Checkpoint") -> Optional[dict]:
    if KEY_FILE not in c.side_files:
        return None
    try:
        return json.loads(c.side_file(KEY_FILE))
    except ValueError:
        return None


def _views(c: "ckpt.Checkpoint", device) -> Dict[str, torch.Tensor]:
    out = {n: c.tensor(n) for n in c.keys()}
    if device is not None:
        out = {n: t.to(device) for n, t in out.items()}
    return out


def _owned_by(c: "ckpt.Checkpoint", uid: int) -> bool:
    """Whether the daemon recorded `uid` as the publisher of attached generation `c`."""
    return int(c.owner_uid) == int(uid)


def _lookup(client, name: str, key: Mapping[str, Any]):
    """The attached entry `name` if the daemon says its key's publisher published it and
    its stored key is `key`; else None."""
    try:
        c = client.attach(name)
    except ckpt.NotFound:
        return None
    if not _owned_by(c, key["publisher"]):
        return None
    return c if _stored_key(c) == json.loads(json.dumps(key)) else None


def get_or_build(client: "ckpt.Client", source: str, build: Callable[..., Mapping[str, torch.Tensor]], *,
                 rank: int = 0, world: int = 1, layout: Any = None, dtype: Any = None, quantization: Any = None,
                 versions: Optional[Mapping[str, str]] = None, user_key: Any = None, prefix: str = "cache",
                 match_generation: bool = True, device=None, timeout: float = 600.0,
                 trusted: Optional[Sequence[int]] = None) -> CacheEntry:
    """Attaches this rank's cached entry for the current generation of checkpoint `source`
    when its key matches and it was published by this uid or a trusted one (see
    trusted_uids), else calls ``build(source_checkpoint, rank, world)``, publishes what it
    returns (a dict of tensors, CPU or CUDA) under this uid's entry name and attaches
    that. See the module's docstring for the key, the name, trust and concurrency. Errors
    from the daemon raise ckpt.CkptError subclasses (NotFound: `source` is not loaded;
    PermissionDenied: this user may not publish)."""
    src = client.attach(source)
    me = os.geteuid()
    key = None
    for publisher in [me] + [u for u in trusted_uids(trusted) if u != me]:
        k = cache_key(src, rank=rank, world=world, layout=layout, dtype=dtype, quantization=quantization,
                      versions=versions, user_key=user_key, match_generation=match_generation, publisher=publisher)
        if key is None:
            key = k  # this uid's own: what a miss publishes
        hit = _lookup(client, cache_name(k, prefix), k)
        if hit is not None:
            return CacheEntry(cache_name(k, prefix), True, hit, _views(hit, device), k)
    name = cache_name(key, prefix)
    built = build(src, rank, world)
    if not isinstance(built, Mapping) or not all(isinstance(t, torch.Tensor) for t in built.values()):
        raise TypeError("serving_cache.get_or_build: build() must return a dict of tensors")
    side = {KEY_FILE: json.dumps(key, sort_keys=True).encode()}
    deadline = time.monotonic() + timeout
    while True:
        try:
            client.publish(name, dict(built), side_files=side, timeout=max(deadline - time.monotonic(), 1.0))
        except ckpt.AlreadyExists:
            pass  # another process publishes (or published) this entry: use theirs (below)
        try:
            c = client.attach(name)
        except ckpt.NotFound:
            # The other writer is still writing (the name is taken, nothing is visible yet) or
            # its write failed (the name is free again): wait, then publish ours.
            if time.monotonic() >= deadline:
                raise ckpt.DeadlineExceeded("serving cache entry '%s': another process kept it unpublished "
                                            "for %.0f s" % (name, timeout))
            time.sleep(0.05)
            continue
        break
    del built
    if not _owned_by(c, me):
        raise ckpt.PermissionDenied("serving cache entry '%s' is owned by uid %d, not by this uid %d: an admin "
                                    "published it; it is not used" % (name, c.owner_uid, me))
    if _stored_key(c) != json.loads(json.dumps(key)):
        raise ckpt.FailedPrecondition("serving cache entry '%s' exists with another key: evict it" % name)
    return CacheEntry(name, False, c, _views(c, device), key)


def evict_stale(client: "ckpt.Client", prefix: str = "cache", *, force: bool = False, wait: float = 0.0) -> List[str]:
    """Evicts cache entries (names ``u<uid>.<prefix>-*`` that carry a key) whose source
    checkpoint is no longer loaded, or whose current generation or content no longer
    matches the key: this uid's own (every uid's for an admin; the daemon refuses the
    others). Attached entries are skipped unless `force` (their users keep their mapping)
    or they detach within `wait` seconds. Returns the names evicted."""
    evicted = []
    pattern = re.compile(r"u[0-9]+\." + re.escape(prefix) + "-")
    for summary in client.list():
        name = summary["name"]
        if not pattern.match(name):
            continue
        try:
            entry = client.attach(name)
        except ckpt.NotFound:
            continue
        key = _stored_key(entry)
        del entry
        if key is None:
            continue
        stale = False
        try:
            src = client.attach(key["source"])
            if key.get("generation") is not None and int(src.generation) != key["generation"]:
                stale = True
            elif source_checksum(src) != key.get("checksum"):
                stale = True
            del src
        except ckpt.NotFound:
            stale = True
        if stale:
            try:
                client.evict(name, force=force, wait=wait)
                evicted.append(name)
            except (ckpt.FailedPrecondition, ckpt.NotFound, ckpt.PermissionDenied):
                pass
    return evicted
