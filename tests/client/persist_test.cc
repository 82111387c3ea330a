// ckptctl persist / ckpt::Persist against the real ckptd: a generation written to a folder
// as safetensors, read back by hand (the format, not our parser) and loaded back with
// `ckptctl load` to the same bytes; sharding with transformers' names and index; a full
// disk (a small tmpfs) and a read-only one leave the old folder intact with no debris; a
// name that is not loaded, a folder in the way; readers, an eviction and a cancel during
// the write.
#include <dirent.h>
#include <signal.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "ckpt/client.h"
#include "ckpt/persist.h"
#include "support/test_env.h"

namespace ckpt {
namespace {

using nlohmann::json;
using testing::CommandResult;
using testing::DaemonProcess;
using testing::ReadFile;
using testing::ScratchDir;
using testing::WriteFile;

std::vector<std::string> ListDir(const std::string& path) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(path.c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.emplace_back(e->d_name);
    }
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// One safetensors file read by hand: header JSON and each tensor's bytes.
struct ParsedFile {
  json header;
  std::map<std::string, std::string> bytes;
};

ParsedFile ParseSafetensors(const std::string& file) {
  ParsedFile p;
  EXPECT_GE(file.size(), 8u);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<uint8_t>(file[i])) << (8 * i);
  EXPECT_LE(8 + n, file.size());
  EXPECT_EQ(n % 8, 0u) << "header padded to 8 bytes";
  p.header = json::parse(file.substr(8, n));
  uint64_t expected_start = 0;
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (auto it = p.header.begin(); it != p.header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const uint64_t b = (*it)["data_offsets"][0], e = (*it)["data_offsets"][1];
    spans.emplace_back(b, e);
    p.bytes[it.key()] = file.substr(8 + n + b, e - b);
  }
  std::sort(spans.begin(), spans.end());
  for (auto [b, e] : spans) {
    EXPECT_EQ(b, expected_start) << "tensors packed without holes";
    expected_start = e;
  }
  EXPECT_EQ(8 + n + expected_start, file.size()) << "no bytes after the last tensor";
  return p;
}

std::map<std::string, uint64_t> Checksums(Client& c, const std::string& name) {
  std::map<std::string, uint64_t> out;
  auto info = c.Info(name);
  EXPECT_TRUE(info.ok()) << info.status().ToString();
  if (info.ok()) {
    for (const TensorInfo& t : *info) out[t.name] = t.checksum;
  }
  return out;
}

// A safetensors file: `count` F32 tensors "w<i>" of `floats` floats each
// (value i * 1000 + j), an I64 scalar and a metadata block.
std::string PatternFile(int count, uint64_t floats) {
  std::string step(8, '\0');
  step[0] = 7;
  std::vector<testing::TestTensor> tensors = {{"step", DType::kI64, {}, step}};
  for (int i = 0; i < count; ++i) {
    std::vector<float> v(floats);
    for (uint64_t j = 0; j < floats; ++j) v[j] = static_cast<float>(i * 1000 + j % 997);
    tensors.push_back({"w" + std::to_string(i), DType::kF32, {static_cast<int64_t>(floats)},
                       std::string(reinterpret_cast<const char*>(v.data()), floats * 4)});
  }
  return testing::SafetensorsOf(tensors, {{"format", "pt"}, {"step", "1000"}});
}

class PersistTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(daemon_.Start());
    auto c = Client::Connect(daemon_.socket());
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    client_ = std::move(c).value();
  }
  void Load(const std::string& path, const std::string& name) {
    CommandResult r = daemon_.Ctl({"load", path, "--name", name});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  // Every byte of every tensor of `name`, read from an attachment.
  std::map<std::string, std::string> AttachedBytes(const std::string& name) {
    std::map<std::string, std::string> out;
    auto ck = client_->Attach(name);
    EXPECT_TRUE(ck.ok()) << ck.status().ToString();
    if (!ck.ok()) return out;
    for (const TensorInfo& t : (*ck)->tensors()) {
      auto v = (*ck)->Tensor(t.name);
      out[t.name] = std::string(reinterpret_cast<const char*>(v->data), t.nbytes);
    }
    return out;
  }

  ScratchDir files_;
  DaemonProcess daemon_;
  std::unique_ptr<Client> client_;
};

TEST_F(PersistTest, RoundTripOfATorchCheckpointWithSideFilesGivesTheSameBytes) {
  ASSERT_EQ(::mkdir(files_.File("m").c_str(), 0755), 0);
  ASSERT_NO_FATAL_FAILURE(testing::MakeCheckpoint({files_.File("m/model.safetensors"), "--mib", "6", "--layers", "2"}));
  const std::string config = "{\"model_type\": \"gpt_neo\", \"hidden_size\": 64}\n";
  WriteFile(files_.File("m/config.json"), config);
  ASSERT_NO_FATAL_FAILURE(Load(files_.File("m"), "gpt"));
  const auto original = AttachedBytes("gpt");
  ASSERT_FALSE(original.empty());

  const std::string out = files_.File("saved");
  CommandResult r = daemon_.Ctl({"persist", "gpt", out, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json j = json::parse(r.out);
  EXPECT_EQ(j["files"], json::array({"model.safetensors"}));
  EXPECT_EQ(j["side_files"], json::array({"config.json"}));
  EXPECT_EQ(ListDir(out), (std::vector<std::string>{"config.json", "model.safetensors"}));
  EXPECT_EQ(ListDir(files_.path()), (std::vector<std::string>{"m", "saved"})) << "no temporary folder left";
  EXPECT_EQ(ReadFile(out + "/config.json"), config);

  // The format by hand: every tensor's dtype, shape and bytes.
  ParsedFile p = ParseSafetensors(ReadFile(out + "/model.safetensors"));
  EXPECT_EQ(p.bytes, original);
  auto info = client_->Info("gpt");
  ASSERT_TRUE(info.ok());
  for (const TensorInfo& t : *info) {
    EXPECT_EQ(p.header[t.name]["dtype"], DTypeName(t.dtype)) << t.name;
    EXPECT_EQ(p.header[t.name]["shape"].get<std::vector<int64_t>>(), t.shape) << t.name;
  }

  // And back through the daemon: the same checksums, the side file kept.
  ASSERT_NO_FATAL_FAILURE(Load(out, "back"));
  EXPECT_EQ(Checksums(*client_, "back"), Checksums(*client_, "gpt"));
  EXPECT_EQ(AttachedBytes("back"), original);
  auto back = client_->Attach("back");
  ASSERT_TRUE(back.ok());
  auto side = (*back)->SideFile("config.json");
  ASSERT_TRUE(side.ok());
  EXPECT_EQ(*side, config);
}

TEST_F(PersistTest, MetadataIsKeptAndTheSafetensorsPackageReadsTheFileWhenPresent) {
  WriteFile(files_.File("p.safetensors"), PatternFile(3, 1000));
  ASSERT_NO_FATAL_FAILURE(Load(files_.File("p.safetensors"), "p"));
  const std::string out = files_.File("out");
  ASSERT_EQ(daemon_.Ctl({"persist", "p", out}).exit_code, 0);
  ParsedFile parsed = ParseSafetensors(ReadFile(out + "/model.safetensors"));
  EXPECT_EQ(parsed.header["__metadata__"], (json{{"format", "pt"}, {"step", "1000"}}));
  EXPECT_EQ(parsed.header["step"]["shape"], json::array());
  ASSERT_NO_FATAL_FAILURE(Load(out, "p2"));
  auto p2 = client_->Attach("p2");
  ASSERT_TRUE(p2.ok());
  EXPECT_EQ((*p2)->metadata(), (std::map<std::string, std::string>{{"format", "pt"}, {"step", "1000"}}));
  // The safetensors package itself, where installed (not in Debian; the GPU machine has it).
  CommandResult py = testing::RunTorchPython(
      "import sys\n"
      "try:\n  from safetensors.torch import load_file\nexcept ImportError:\n  print('absent'); sys.exit(0)\n"
      "sd = load_file(sys.argv[1]); print(sorted(sd), int(sd['step']), float(sd['w2'][5]))\n",
      {out + "/model.safetensors"});
  ASSERT_EQ(py.exit_code, 0) << py.err;
  if (py.out != "absent\n") {
    EXPECT_EQ(py.out, "['step', 'w0', 'w1', 'w2'] 7 2005.0\n");
  }
}

TEST_F(PersistTest, ShardsWithTransformersNamesAndAnIndexAboveMaxShardSize) {
  WriteFile(files_.File("p.safetensors"), PatternFile(10, 25000));  // 10 x 100000 bytes + 8
  ASSERT_NO_FATAL_FAILURE(Load(files_.File("p.safetensors"), "p"));
  const std::string out = files_.File("sharded");
  CommandResult r = daemon_.Ctl({"persist", "p", out, "--max-shard-size", "250KB"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // step + w0 + w1 (200008 bytes) | w2 w3 | w4 w5 | w6 w7 | w8 w9: five files.
  const std::vector<std::string> names = ListDir(out);
  ASSERT_EQ(names, (std::vector<std::string>{"model-00001-of-00005.safetensors", "model-00002-of-00005.safetensors",
                                             "model-00003-of-00005.safetensors", "model-00004-of-00005.safetensors",
                                             "model-00005-of-00005.safetensors", "model.safetensors.index.json"}));
  json index = json::parse(ReadFile(out + "/model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"], 8 + 10 * 100000);
  EXPECT_EQ(index["weight_map"].size(), 11u);
  std::map<std::string, std::string> all;
  for (size_t i = 0; i + 1 < names.size(); ++i) {
    ParsedFile p = ParseSafetensors(ReadFile(out + "/" + names[i]));
    uint64_t data = 0;
    for (auto& [k, v] : p.bytes) {
      EXPECT_EQ(index["weight_map"][k], names[i]) << k;
      data += v.size();
      all[k] = v;
    }
    EXPECT_LE(data, 250000u) << names[i];
  }
  EXPECT_EQ(all, AttachedBytes("p"));
  ASSERT_NO_FATAL_FAILURE(Load(out, "p2"));
  EXPECT_EQ(Checksums(*client_, "p2"), Checksums(*client_, "p"));
  // A tensor above the limit gets a file of its own.
  r = daemon_.Ctl({"persist", "p", files_.File("tiny"), "--max-shard-size", "1000"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ListDir(files_.File("tiny")).size(), 12u);  // 11 files + the index
  // Malformed sizes are refused before anything is written.
  for (const char* bad : {"0", "5XB", "GB", "-1", "1.2.3"}) {
    r = daemon_.Ctl({"persist", "p", files_.File("bad"), "--max-shard-size", bad});
    EXPECT_EQ(r.exit_code, 1) << bad;
    EXPECT_FALSE(r.err.empty());
  }
  EXPECT_TRUE(ListDir(files_.File("bad")).empty());
}

// Mounts a tmpfs of `size` at `path` (root only); false if it cannot.
bool MountTmpfs(const std::string& path, const std::string& options) {
  return ::mkdir(path.c_str(), 0755) == 0 && ::mount("tmpfs", path.c_str(), "tmpfs", 0, options.c_str()) == 0;
}

TEST_F(PersistTest, AFullDiskLeavesTheOldFilesIntactAndNoDebris) {
  const std::string mnt = files_.File("mnt");
  if (!MountTmpfs(mnt, "size=4m")) GTEST_SKIP() << "cannot mount a tmpfs (needs root): " << std::strerror(errno);
  struct Unmount {
    std::string p;
    ~Unmount() { ::umount2(p.c_str(), MNT_DETACH); }
  } unmount{mnt};
  WriteFile(files_.File("small.safetensors"), PatternFile(2, 1000));
  WriteFile(files_.File("big.safetensors"), PatternFile(8, 200000));  // 6.4 MB: does not fit
  ASSERT_NO_FATAL_FAILURE(Load(files_.File("small.safetensors"), "small"));
  ASSERT_NO_FATAL_FAILURE(Load(files_.File("big.safetensors"), "big"));
  const std::string out = mnt + "/model";
  ASSERT_EQ(daemon_.Ctl({"persist", "small", out}).exit_code, 0);
  const std::string old_bytes = ReadFile(out + "/model.safetensors");

  for (const char* max : {"5GB", "1MB"}) {  // one file (fails at the reservation), shards (fails midway)
    CommandResult r = daemon_.Ctl({"persist", "big", out, "--replace", "--max-shard-size", max});
    EXPECT_EQ(r.exit_code, 1) << max;
    EXPECT_NE(r.err.find("No space left on device"), std::string::npos) << r.err;
    EXPECT_EQ(ListDir(mnt), std::vector<std::string>{"model"}) << "no temporary folder left (" << max << ")";
    EXPECT_EQ(ListDir(out), std::vector<std::string>{"model.safetensors"});
    EXPECT_EQ(ReadFile(out + "/model.safetensors"), old_bytes);
  }
  // The same through the API: ResourceExhausted, and the daemon keeps serving.
  PersistOptions options;
  options.replace = true;
  options.max_shard_bytes = 1000000;
  auto r = Persist(*client_, "big", out, options);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();
  EXPECT_EQ(ListDir(mnt), std::vector<std::string>{"model"});
  EXPECT_TRUE(client_->List().ok());
}

TEST_F(PersistTest, AReadOnlyOrForeignFolderIsAClearErrorWithNothingWritten) {
  WriteFile(files_.File("p.safetensors"), PatternFile(2, 1000));
  ASSERT_NO_FATAL_FAILURE(Load(files_.File("p.safetensors"), "p"));
  const std::string ro = files_.File("ro");
  if (MountTmpfs(ro, "size=1m")) {
    struct Unmount {
      std::string p;
      ~Unmount() { ::umount2(p.c_str(), MNT_DETACH); }
    } unmount{ro};
    ASSERT_EQ(::mount("tmpfs", ro.c_str(), "tmpfs", MS_REMOUNT | MS_RDONLY, "size=1m"), 0);
    CommandResult r = daemon_.Ctl({"persist", "p", ro + "/out"});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("Read-only file system"), std::string::npos) << r.err;
    EXPECT_TRUE(ListDir(ro).empty());
  }
  // A user who may not write the parent folder (ckptctl runs with the caller's permissions).
  const std::string locked = files_.File("locked");
  ASSERT_EQ(::mkdir(locked.c_str(), 0755), 0);
  ASSERT_EQ(::chmod(files_.path().c_str(), 0755), 0);
  const std::string socket_dir = daemon_.socket().substr(0, daemon_.socket().rfind('/'));
  ASSERT_EQ(::chmod(socket_dir.c_str(), 0755), 0);
  ASSERT_EQ(::chmod(daemon_.socket().c_str(), 0666), 0);
  CommandResult r = testing::RunCommand({"setpriv", "--reuid", "nobody", "--regid", "nogroup", "--clear-groups",
                                         CKPTCTL_BIN, "--socket", daemon_.socket(), "persist", "p", locked + "/out"});
  if (r.err.find("beside the destination") == std::string::npos) {
    GTEST_LOG_(INFO) << "'nobody' could not reach the checkpoint here: " << r.err;
  } else {
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_NE(r.err.find("Permission denied"), std::string::npos) << r.err;
  }
  EXPECT_TRUE(ListDir(locked).empty());

  // The name is not loaded: NotFound, nothing created.
  r = daemon_.Ctl({"persist", "nope", files_.File("nope")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("nope"), std::string::npos) << r.err;
  EXPECT_EQ(::access(files_.File("nope").c_str(), F_OK), -1);

  // A folder in the way: not empty without --replace; with subfolders even with it; a
  // symlink; a file.
  const std::string busy = files_.File("busy");
  ASSERT_EQ(::mkdir(busy.c_str(), 0755), 0);
  WriteFile(busy + "/notes.txt", "mine");
  r = daemon_.Ctl({"persist", "p", busy});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("not empty"), std::string::npos) << r.err;
  ASSERT_EQ(::mkdir((busy + "/sub").c_str(), 0755), 0);
  r = daemon_.Ctl({"persist", "p", busy, "--replace"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("not a regular file"), std::string::npos) << r.err;
  EXPECT_EQ(ListDir(busy), (std::vector<std::string>{"notes.txt", "sub"}));
  ASSERT_EQ(::symlink(busy.c_str(), files_.File("link").c_str()), 0);
  r = daemon_.Ctl({"persist", "p", files_.File("link"), "--replace"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("symbolic link"), std::string::npos) << r.err;
  WriteFile(files_.File("plain"), "x");
  r = daemon_.Ctl({"persist", "p", files_.File("plain"), "--replace"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("not a folder"), std::string::npos) << r.err;
  EXPECT_EQ(ReadFile(files_.File("plain")), "x");
  for (const std::string& n : ListDir(files_.path())) EXPECT_EQ(n.find(".persist-"), std::string::npos) << n;
  // --replace of a folder of files swaps it whole.
  rmdir((busy + "/sub").c_str());
  r = daemon_.Ctl({"persist", "p", busy, "--replace"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ListDir(busy), std::vector<std::string>{"model.safetensors"});
}

TEST_F(PersistTest, ReadersEvictionAndReplacementDuringAPersistDoNotDisturbIt) {
  WriteFile(files_.File("big.safetensors"), PatternFile(16, 1 << 20));  // 64 MiB: several progress ticks
  ASSERT_NO_FATAL_FAILURE(Load(files_.File("big.safetensors"), "big"));
  const auto checksums = Checksums(*client_, "big");
  WriteFile(files_.File("other.safetensors"), PatternFile(2, 100));
  int ticks = 0;
  bool disturbed = false;
  PersistOptions options;
  options.max_shard_bytes = 16 << 20;
  options.progress = [&](uint64_t done, uint64_t total) {
    ++ticks;
    if (!disturbed && done > 0 && done < total) {
      disturbed = true;
      // Another reader attaches and verifies meanwhile; the generation is replaced, then evicted.
      auto other = Client::Connect(daemon_.socket());
      EXPECT_TRUE(other.ok());
      auto reader = (*other)->Attach("big");
      EXPECT_TRUE(reader.ok());
      if (reader.ok()) {
        EXPECT_TRUE((*reader)->Verify().ok());
      }
      EXPECT_EQ(daemon_.Ctl({"load", files_.File("other.safetensors"), "--name", "big", "--replace"}).exit_code, 0);
      EXPECT_EQ(daemon_.Ctl({"evict", "big", "--force"}).exit_code, 0);
    }
    return true;
  };
  auto r = Persist(*client_, "big", files_.File("out"), options);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(disturbed);
  EXPECT_GT(ticks, 1);
  EXPECT_EQ(r->files.size(), 6u);  // step + w0..w2 | w3..w6 | w7..w10 | w11..w14 | w15, and the index
  ASSERT_NO_FATAL_FAILURE(Load(files_.File("out"), "back"));
  EXPECT_EQ(Checksums(*client_, "back"), checksums) << "the generation attached at the start was written";
}

TEST_F(PersistTest, CancelOrAnExceptionLeavesTheOldFolderAndNoDebris) {
  WriteFile(files_.File("a.safetensors"), PatternFile(2, 100));
  WriteFile(files_.File("big.safetensors"), PatternFile(16, 1 << 20));
  ASSERT_NO_FATAL_FAILURE(Load(files_.File("a.safetensors"), "a"));
  ASSERT_NO_FATAL_FAILURE(Load(files_.File("big.safetensors"), "big"));
  const std::string out = files_.File("out");
  ASSERT_EQ(daemon_.Ctl({"persist", "a", out}).exit_code, 0);
  const std::string old_bytes = ReadFile(out + "/model.safetensors");
  PersistOptions options;
  options.replace = true;
  options.progress = [](uint64_t done, uint64_t) { return done < (8u << 20); };
  auto r = Persist(*client_, "big", out, options);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCancelled);
  EXPECT_EQ(ListDir(files_.path()), (std::vector<std::string>{"a.safetensors", "big.safetensors", "out"}));
  EXPECT_EQ(ReadFile(out + "/model.safetensors"), old_bytes);
  options.progress = [](uint64_t done, uint64_t) -> bool {
    if (done > (8u << 20)) throw std::runtime_error("stop");
    return true;
  };
  EXPECT_THROW((void)Persist(*client_, "big", out, options), std::runtime_error);
  EXPECT_EQ(ListDir(files_.path()), (std::vector<std::string>{"a.safetensors", "big.safetensors", "out"}));
  EXPECT_EQ(ReadFile(out + "/model.safetensors"), old_bytes);
  // A stale generation is refused.
  options.progress = nullptr;
  options.expected_generation = 999;
  r = Persist(*client_, "big", files_.File("g"), options);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status().ToString();
}

TEST_F(PersistTest, CtrlCDuringCkptctlPersistCancelsWithNothingLeft) {
  WriteFile(files_.File("big.safetensors"), PatternFile(64, 2 << 20));  // 512 MiB: a second or more to write
  ASSERT_NO_FATAL_FAILURE(Load(files_.File("big.safetensors"), "big"));
  ::unlink(files_.File("big.safetensors").c_str());
  const std::string out = files_.File("out");
  testing::ChildProcess ctl({CKPTCTL_BIN, "--socket", daemon_.socket(), "persist", "big", out});
  // Wait until the temporary folder exists: the persist is writing.
  bool writing = false;
  for (int i = 0; i < 2000 && !writing; ++i) {
    for (const std::string& n : ListDir(files_.path())) writing = writing || n.find(".out.persist-") == 0;
    if (!writing) ::usleep(1000);
  }
  ASSERT_TRUE(writing);
  ::kill(ctl.pid(), SIGINT);
  CommandResult r = ctl.Wait();
  EXPECT_EQ(r.exit_code, 130) << r.err;
  EXPECT_NE(r.err.find("persist cancelled"), std::string::npos) << r.err;
  EXPECT_TRUE(ListDir(files_.path()).empty()) << "no folder and no temporary folder";
  EXPECT_TRUE(client_->List().ok());
}

}  // namespace
}  // namespace ckpt
