// Issue 12, part A, against the real ckptd: segments only the daemon can create.
//
// Attacks: a local user (no ckptd group) plants valid-looking copies of a real segment
// with a higher generation, FIFOs and links under the daemon's prefix, pre-creates the
// segment directory or every predictable segment name; root-planted entries inside the
// directory with the wrong owner, mode, name or data. None of it is ever adopted or
// served, none of it blocks start-up, a load still succeeds (squatting the directory
// itself: segment_location_test.cc). Generation numbers are never reused
// across restarts, and a lease names the segment's identity, not just its generation.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "ckpt/client.h"
#include "integration/ops_helpers.h"
#include "protocol/daemon_connection.h"
#include "protocol/wire.h"
#include "shm/segment_format.h"
#include "shm/segment_name.h"
#include "support/test_env.h"

namespace ckpt {
namespace {

using nlohmann::json;
using testing::CommandResult;
using testing::DaemonProcess;
using testing::ReadFile;
using testing::ScratchDir;
using testing::TempUser;

namespace fs = std::filesystem;

// Old-style objects (/dev/shm/<prefix>.*) a test planted; removed at the end.
struct LegacyObjects {
  std::string prefix;
  ~LegacyObjects() {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator("/dev/shm", ec)) {
      if (e.path().filename().string().rfind(prefix + ".", 0) == 0) fs::remove(e.path(), ec);
    }
  }
};

class PlantedSegmentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(::chmod(files_.path().c_str(), 0755), 0);  // the attacker may read its forgeries here
    testing::WritePatternCheckpoint(files_.File("m.safetensors"), 3, 1, 256);  // 256 KiB
    testing::WritePatternCheckpoint(files_.File("evil.safetensors"), 66, 6, 256);
    ASSERT_TRUE(daemon_.Start()) << ReadFile(daemon_.log_path());
  }

  json CtlJson(const std::vector<std::string>& args) {
    std::vector<std::string> a = args;
    a.push_back("--json");
    CommandResult r = daemon_.Ctl(a);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return json::parse(r.out, nullptr, false);
  }
  json LoadJson(const std::string& file, const std::string& name, bool replace = false) {
    std::vector<std::string> args = {"load", files_.File(file), "--name", name};
    if (replace) args.push_back("--replace");
    return CtlJson(args)["checkpoint"];
  }
  // The (only) segment file of checkpoint `name`.
  std::string SegmentOf(const std::string& name) {
    auto names = testing::ListSegments(daemon_.shm_prefix(), name + ".");
    EXPECT_EQ(names.size(), 1u);
    return names.empty() ? "" : names[0];
  }
  std::string SegmentPath(const std::string& file) { return daemon_.segment_dir() + "/" + file; }

  // A copy of segment `file` made consistent for generation `gen` and a fresh id: the
  // header's generation and id patched, the name to match. Returns (file name, bytes).
  std::pair<std::string, std::string> Forge(const std::string& file, uint64_t gen) {
    std::string bytes = ReadFile(SegmentPath(file));
    EXPECT_GE(bytes.size(), sizeof(shm::SegmentHeader));
    auto* h = reinterpret_cast<shm::SegmentHeader*>(bytes.data());
    auto id = shm::RandomSegmentId();
    EXPECT_TRUE(id.ok());
    h->generation = gen;
    std::memcpy(h->segment_id, id->data(), id->size());
    return {shm::SegmentName{h->checkpoint_name, gen, *id}.ToString(), bytes};
  }

  // Runs ckptd on this test's prefix and state directory (or `state_dir`; the daemon_ must be stopped),
  // bounded by `timeout 20` so a daemon that wrongly starts cannot hang the test.
  CommandResult RunDaemon(const std::string& state_dir = "") {
    return testing::RunCommand({"timeout", "20", CKPTD_BIN, "--socket", files_.File("other.sock"), "--shm-prefix",
                                daemon_.shm_prefix(), "--state-dir", state_dir.empty() ? daemon_.state_dir() : state_dir});
  }

  // Runs a second ckptd on this test's prefix and state directory but another socket,
  // calls fn(socket), then stops it with SIGTERM (its segments stay unless extra says so).
  template <typename F>
  void WithSecondDaemon(const std::vector<std::string>& extra, F fn) {
    const std::string sock = files_.File("second.sock");
    std::vector<std::string> argv = {CKPTD_BIN, "--socket", sock, "--shm-prefix", daemon_.shm_prefix(),
                                     "--state-dir", daemon_.state_dir()};
    argv.insert(argv.end(), extra.begin(), extra.end());
    testing::ChildProcess second(argv);
    // Answering, not just bound (the socket file exists a moment before it listens).
    ASSERT_TRUE(testing::WaitFor([&] { return protocol::ConnectUnix(sock).ok(); }, 10000)) << second.Wait().err;
    fn(sock);
    ::kill(second.pid(), SIGTERM);
    CommandResult r = second.Wait();
    EXPECT_EQ(r.exit_code, 0) << r.err;
  }

  uint64_t Attached(Client& client, const std::string& name) {
    auto list = client.List();
    if (!list.ok()) return ~0ull;
    for (const auto& c : *list) {
      if (c.name == name) return c.attached;
    }
    return ~0ull;
  }

  ScratchDir files_;
  DaemonProcess daemon_;
};

TEST_F(PlantedSegmentTest, AnOutsiderCanNeitherPlantNorSquatAndItsForgeriesAreNeverAdopted) {
  TempUser attacker;
  LegacyObjects legacy{daemon_.shm_prefix()};
  json real = LoadJson("m.safetensors", "m");
  const uint64_t gen = real["generation"].get<uint64_t>();
  const std::string real_file = SegmentOf("m");
  ASSERT_EQ(real["shm_name"], real_file);
  EXPECT_EQ(real["segment_id"].get<std::string>().size(), 32u);
  // A forged, internally consistent copy with a higher generation, readable by the attacker.
  auto [forged_name, forged] = Forge(real_file, gen + 10);
  testing::WriteFile(files_.File("forged"), forged);
  ASSERT_EQ(::chmod(files_.File("forged").c_str(), 0644), 0);

  // The segment directory is closed to the attacker: no listing, no new names.
  EXPECT_NE(testing::RunCommand(attacker.As({"ls", daemon_.segment_dir()})).exit_code, 0);
  CommandResult plant = testing::RunCommand(attacker.As({"cp", files_.File("forged"), SegmentPath(forged_name)}));
  EXPECT_NE(plant.exit_code, 0) << "the attacker wrote into the segment directory";
  EXPECT_FALSE(fs::exists(SegmentPath(forged_name)));
  // Where the old daemon looked: /dev/shm/<prefix>.<name>.<generation>. A forged copy
  // there, and a FIFO (which would block an open without O_NONBLOCK).
  const std::string legacy_copy = "/dev/shm/" + daemon_.shm_prefix() + ".m." + std::to_string(gen + 10);
  const std::string legacy_fifo = "/dev/shm/" + daemon_.shm_prefix() + ".m." + std::to_string(gen + 11);
  ASSERT_EQ(testing::RunCommand(attacker.As({"cp", files_.File("forged"), legacy_copy})).exit_code, 0);
  ASSERT_EQ(testing::RunCommand(attacker.As({"mkfifo", legacy_fifo})).exit_code, 0);

  // Defence in depth: the same forgery inside the directory, planted by root but owned
  // by the attacker (as if the directory had been writable).
  testing::WriteFile(SegmentPath(forged_name), forged);
  ASSERT_EQ(::chmod(SegmentPath(forged_name).c_str(), 0640), 0);
  passwd* pw = ::getpwnam(attacker.name().c_str());
  ASSERT_NE(pw, nullptr);
  ASSERT_EQ(::chown(SegmentPath(forged_name).c_str(), pw->pw_uid, pw->pw_gid), 0);

  daemon_.Kill();
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(daemon_.Start()) << ReadFile(daemon_.log_path());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5)) << "start-up was held up";
  json list = CtlJson({"list"})["checkpoints"];
  ASSERT_EQ(list.size(), 1u) << list.dump();
  EXPECT_EQ(list[0]["generation"], gen) << "a forged generation was adopted";
  EXPECT_EQ(list[0]["segment_id"], real["segment_id"]);
  EXPECT_EQ(testing::ListSegments(daemon_.shm_prefix()), std::vector<std::string>{real_file})
      << "the foreign segment was not removed";
  const std::string log = ReadFile(daemon_.log_path());
  EXPECT_NE(log.find("removing segment " + SegmentPath(forged_name) + ": " + SegmentPath(forged_name) +
                     " is owned by uid " + std::to_string(pw->pw_uid)),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("ignoring 2 object(s) /dev/shm/" + daemon_.shm_prefix() + ".*"), std::string::npos) << log;
  EXPECT_TRUE(fs::exists(legacy_copy)) << "not ours: left alone, never opened";
  // Readers get the real bytes.
  auto client = Client::Connect(daemon_.socket());
  ASSERT_TRUE(client.ok());
  auto attached = (*client)->Attach("m");
  ASSERT_TRUE(attached.ok()) << attached.status().ToString();
  auto meta = (*attached)->Tensor("meta");
  auto w = (*attached)->Tensor("w");
  ASSERT_TRUE(meta.ok() && w.ok());
  EXPECT_EQ(reinterpret_cast<const int64_t*>(meta->data)[0], 3);
  EXPECT_EQ(testing::WrongFloats(reinterpret_cast<const int64_t*>(meta->data), reinterpret_cast<const float*>(w->data),
                                 w->info->nbytes / 4),
            0u);
}

TEST_F(PlantedSegmentTest, WrongModeMismatchedNamesFifosLinksAndDirectoriesAreRemovedWithoutBlocking) {
  json real = LoadJson("m.safetensors", "m");
  const uint64_t gen = real["generation"].get<uint64_t>();
  const std::string real_file = SegmentOf("m");
  const std::string hex = real["segment_id"].get<std::string>();
  // Every kind of entry, each named like a newer generation of "m", planted by root.
  auto [wrong_mode, forged] = Forge(real_file, gen + 1);
  testing::WriteFile(SegmentPath(wrong_mode), forged);
  ASSERT_EQ(::chmod(SegmentPath(wrong_mode).c_str(), 0644), 0);  // ours, but not the segment mode
  auto [consistent, forged2] = Forge(real_file, gen + 2);
  const std::string mismatched = "m." + std::to_string(gen + 3) + "." + consistent.substr(consistent.rfind('.') + 1);
  testing::WriteFile(SegmentPath(mismatched), forged2);  // header says gen + 2, name gen + 3
  ASSERT_EQ(::chmod(SegmentPath(mismatched).c_str(), 0640), 0);
  auto [other_name, forged3] = Forge(real_file, gen + 4);
  const std::string renamed = "x" + other_name;  // header says "m", the name "xm"
  testing::WriteFile(SegmentPath(renamed), forged3);
  ASSERT_EQ(::chmod(SegmentPath(renamed).c_str(), 0640), 0);
  const std::string fifo = "m." + std::to_string(gen + 5) + "." + hex;
  ASSERT_EQ(::mkfifo(SegmentPath(fifo).c_str(), 0640), 0);
  const std::string link = "m." + std::to_string(gen + 6) + "." + hex;
  ASSERT_EQ(::symlink(SegmentPath(real_file).c_str(), SegmentPath(link).c_str()), 0);
  const std::string link_out = "m." + std::to_string(gen + 7) + "." + hex;
  testing::WriteFile(files_.File("victim"), "keep me");
  ASSERT_EQ(::symlink(files_.File("victim").c_str(), SegmentPath(link_out).c_str()), 0);
  const std::string dir = "m." + std::to_string(gen + 8) + "." + hex;
  ASSERT_EQ(::mkdir(SegmentPath(dir).c_str(), 0750), 0);
  const std::string junk = "not-a-segment";
  testing::WriteFile(SegmentPath(junk), "junk");
  ASSERT_EQ(::chmod(SegmentPath(junk).c_str(), 0640), 0);

  daemon_.Kill();
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(daemon_.Start()) << ReadFile(daemon_.log_path());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5)) << "start-up blocked (FIFO?)";
  json list = CtlJson({"list"})["checkpoints"];
  ASSERT_EQ(list.size(), 1u) << list.dump();
  EXPECT_EQ(list[0]["name"], "m");
  EXPECT_EQ(list[0]["generation"], gen);
  EXPECT_EQ(list[0]["segment_id"], hex);
  EXPECT_EQ(testing::ListSegments(daemon_.shm_prefix()), std::vector<std::string>{real_file});
  EXPECT_EQ(ReadFile(files_.File("victim")), "keep me") << "a link was followed";
  const std::string log = ReadFile(daemon_.log_path());
  for (const auto& [file, why] : std::vector<std::pair<std::string, std::string>>{
           {wrong_mode, "has mode 0644, not the segment mode 0640"},
           {mismatched, "does not match its file name"},
           {renamed, "does not match its file name"},
           {fifo, "not a regular file"},
           {link, "symbolic link"},
           {link_out, "symbolic link"},
           {dir, "not a regular file"},
           {junk, "not a segment file name"}}) {
    EXPECT_NE(log.find("removing segment " + SegmentPath(file) + ": "), std::string::npos) << file << "\n" << log;
    const size_t at = log.find("removing segment " + SegmentPath(file));
    if (at != std::string::npos) {
      EXPECT_NE(log.substr(at, log.find('\n', at) - at).find(why), std::string::npos) << file << "\n" << log;
    }
  }
}

TEST_F(PlantedSegmentTest, DataCorruptedWhileTheDaemonWasDownIsNeverServed) {
  json real = LoadJson("m.safetensors", "m");
  LoadJson("evil.safetensors", "other");
  const std::string file = SegmentOf("m");
  ASSERT_EQ(daemon_.Stop(), 0);
  {
    // Flip one byte in the middle of the tensor data (not the header or the index).
    int fd = ::open(SegmentPath(file).c_str(), O_RDWR | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    struct stat st;
    ASSERT_EQ(::fstat(fd, &st), 0);
    const off_t at = st.st_size - 4096 * 8;
    unsigned char b = 0;
    ASSERT_EQ(::pread(fd, &b, 1, at), 1);
    b ^= 0x10;
    ASSERT_EQ(::pwrite(fd, &b, 1, at), 1);
    ::close(fd);
  }
  ASSERT_TRUE(daemon_.Start()) << ReadFile(daemon_.log_path());
  json list = CtlJson({"list"})["checkpoints"];
  ASSERT_EQ(list.size(), 1u) << list.dump();
  EXPECT_EQ(list[0]["name"], "other") << "the intact checkpoint is adopted";
  EXPECT_TRUE(testing::ListSegments(daemon_.shm_prefix(), "m.").empty()) << "the corrupt segment was not removed";
  const std::string log = ReadFile(daemon_.log_path());
  EXPECT_NE(log.find("removing segment " + SegmentPath(file) + ": 1 of 2 tensors no longer match their checksums"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("start-up verification: "), std::string::npos) << log;
  CommandResult attach = daemon_.Ctl({"info", "m"});
  EXPECT_NE(attach.exit_code, 0);
}

// A squatted segment directory (the old /dev/shm/<prefix>, or the recorded name once the
// directory is gone): tests/integration/segment_location_test.cc.

TEST_F(PlantedSegmentTest, SquattingEveryPredictableNameDoesNotBlockALoad) {
  TempUser attacker;
  LegacyObjects legacy{daemon_.shm_prefix()};
  // Every name the old naming would use for the next generations, and every generation
  // in the new directory (which the attacker cannot write: each attempt fails).
  for (int g = 1; g <= 20; ++g) {
    const std::string n = std::to_string(g);
    ASSERT_EQ(testing::RunCommand(attacker.As({"touch", "/dev/shm/" + daemon_.shm_prefix() + ".m." + n})).exit_code, 0);
    EXPECT_NE(testing::RunCommand(attacker.As({"touch", SegmentPath("m." + n + "." + std::string(32, '0'))})).exit_code, 0);
  }
  json first = LoadJson("m.safetensors", "m");
  ASSERT_TRUE(first.is_object());
  json second = LoadJson("evil.safetensors", "m", /*replace=*/true);
  ASSERT_TRUE(second.is_object());
  EXPECT_GT(second["generation"].get<uint64_t>(), first["generation"].get<uint64_t>());
  EXPECT_NE(second["segment_id"], first["segment_id"]);
  EXPECT_EQ(testing::ListSegments(daemon_.shm_prefix()).size(), 1u);
}

TEST_F(PlantedSegmentTest, GenerationsAreNeverReusedAcrossRestarts) {
  uint64_t last = LoadJson("m.safetensors", "m")["generation"].get<uint64_t>();
  // kill -9, then the segments are lost (a reboot, an operator's rm): a fresh start.
  daemon_.Kill();
  testing::RemoveSegmentDirectory(daemon_.shm_prefix());
  ASSERT_TRUE(daemon_.Start()) << ReadFile(daemon_.log_path());
  EXPECT_TRUE(CtlJson({"list"})["checkpoints"].empty());
  uint64_t next = LoadJson("m.safetensors", "m")["generation"].get<uint64_t>();
  EXPECT_GT(next, last) << "generation reused after a restart without segments";
  last = next;
  // A clean stop that removes every segment (--cleanup-on-exit) does not reset it either.
  ASSERT_EQ(daemon_.Stop(), 0);
  DaemonProcess& d = daemon_;
  WithSecondDaemon({"--cleanup-on-exit"}, [&](const std::string& sock) {
    auto client = Client::Connect(sock);
    ASSERT_TRUE(client.ok());
    auto loaded = (*client)->Load(files_.File("m.safetensors"), "n");
    ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
    EXPECT_GT(loaded->generation, last);
    last = loaded->generation;
  });
  EXPECT_TRUE(testing::ListSegments(d.shm_prefix()).empty()) << "--cleanup-on-exit left segments";
  ASSERT_TRUE(daemon_.Start()) << ReadFile(daemon_.log_path());
  EXPECT_GT(LoadJson("m.safetensors", "m")["generation"].get<uint64_t>(), last);
  EXPECT_EQ(std::stoull(ReadFile(d.state_dir() + "/generation")), last + 1);
}

TEST_F(PlantedSegmentTest, AnUnusableStateDirectoryIsAClearStartUpError) {
  daemon_.Stop();
  testing::WriteFile(files_.File("state-file"), "x");
  CommandResult r = RunDaemon(files_.File("state-file"));
  EXPECT_EQ(r.exit_code, 78) << r.err;  // EX_CONFIG: the unit does not restart
  EXPECT_NE(r.err.find("state directory " + files_.File("state-file") + " is not a directory"), std::string::npos)
      << r.err;
  ASSERT_EQ(::mkdir(files_.File("open-state").c_str(), 0777), 0);
  ASSERT_EQ(::chmod(files_.File("open-state").c_str(), 0777), 0);
  r = RunDaemon(files_.File("open-state"));
  EXPECT_EQ(r.exit_code, 78) << r.err;  // EX_CONFIG: the unit does not restart
  EXPECT_NE(r.err.find("writable by group or others"), std::string::npos) << r.err;
  testing::WriteFile(daemon_.state_dir() + "/generation", "garbage\n");
  r = RunDaemon();
  EXPECT_EQ(r.exit_code, 78) << r.err;  // EX_CONFIG: the unit does not restart
  EXPECT_NE(r.err.find("does not hold a generation number"), std::string::npos) << r.err;
}

TEST_F(PlantedSegmentTest, ALeaseNamesTheSegmentItMappedNotJustTheGeneration) {
  LoadJson("m.safetensors", "m");
  auto client = Client::Connect(daemon_.socket());
  ASSERT_TRUE(client.ok());
  auto old = (*client)->Attach("m");
  ASSERT_TRUE(old.ok()) << old.status().ToString();
  const uint64_t old_gen = (*old)->generation();
  EXPECT_EQ(Attached(**client, "m"), 1u);

  // The protocol: attach with another segment id is refused, a malformed one too.
  auto raw = protocol::DaemonConnection::Open(daemon_.socket());
  ASSERT_TRUE(raw.ok());
  UniqueFd unused;
  auto wrong = (*raw)->Call("attach", json{{"name", "m"}, {"generation", old_gen}, {"segment_id", std::string(32, 'a')}},
                            nullptr, &unused);
  EXPECT_EQ(wrong.status().code(), StatusCode::kNotFound) << wrong.status().ToString();
  auto bad = (*raw)->Call("attach", json{{"name", "m"}, {"segment_id", "zz"}}, nullptr, &unused);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << bad.status().ToString();
  raw->reset();

  // kill -9, everything lost including the state (a wiped node): the same name and the
  // same generation number come back with other content.
  daemon_.Kill();
  testing::RemoveSegmentDirectory(daemon_.shm_prefix());
  fs::remove_all(daemon_.state_dir());
  // The new content is loaded by a daemon on another socket (so the old client cannot
  // reach a daemon before it exists), then adopted by the one on the client's socket.
  WithSecondDaemon({}, [&](const std::string& sock) {
    auto loader = Client::Connect(sock);
    ASSERT_TRUE(loader.ok());
    auto fresh = (*loader)->Load(files_.File("evil.safetensors"), "m");
    ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
    EXPECT_EQ(fresh->generation, old_gen) << "the test needs the number to come back";
  });
  ASSERT_TRUE(daemon_.Start()) << ReadFile(daemon_.log_path());
  ASSERT_EQ(CtlJson({"list"})["checkpoints"].size(), 1u);
  // The old client's lease keeper retries every 0.5 s: it must not register on content
  // it never mapped.
  std::this_thread::sleep_for(std::chrono::seconds(3));
  EXPECT_EQ(Attached(**client, "m"), 0u) << "an old lease was counted on new content";
  EXPECT_TRUE(CtlJson({"evict", "m"}).is_object()) << "nothing holds the new content";
  // Its own mapping still holds the bytes it attached to.
  auto meta = (*old)->Tensor("meta");
  ASSERT_TRUE(meta.ok());
  EXPECT_EQ(reinterpret_cast<const int64_t*>(meta->data)[0], 3);
  EXPECT_TRUE((*old)->Verify().ok());
}

}  // namespace
}  // namespace ckpt
