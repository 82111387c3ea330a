// Files under attack, against the real ckptd: a file truncated and regrown, renamed over,
// swapped for a symlink to a root-only file outside the roots, or a directory of its path
// swapped for a symlink, during the load (the daemon stopped mid-read at a pause point,
// so the swap lands while it reads, every time) or before it; FIFOs, sockets, devices and directories
// where a checkpoint file is expected; layouts that wrap 64 bits or expand absurdly; names
// that are not UTF-8 or given twice; side files kept with the checkpoint. Every case is a
// clear error with nothing published, and the daemon keeps serving.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <future>
#include <nlohmann/json.hpp>

#include "ckpt/ckpt.h"
#include "ckpt/client.h"
#include "integration/ops_helpers.h"
#include "protocol/daemon_connection.h"
#include "support/test_env.h"

namespace ckpt {
namespace {

using nlohmann::json;
using testing::CommandResult;
using testing::DaemonProcess;
using testing::ReadFile;
using testing::ScratchDir;
using testing::WriteFile;

std::string Safetensors(const std::string& header, const std::string& data) {
  return testing::SafetensorsBytes(header, data);
}

// A safetensors file of `tensors` U8 tensors of `each` bytes, every byte `fill`.
std::string BigSafetensors(int tensors, uint64_t each, char fill) {
  std::vector<testing::TestTensor> all;
  for (int i = 0; i < tensors; ++i) {
    all.push_back({"t" + std::to_string(i), DType::kU8, {static_cast<int64_t>(each)}, std::string(each, fill)});
  }
  return testing::SafetensorsOf(all);
}

constexpr int kTensors = 16;

class FilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(::mkdir(root_.File("m").c_str(), 0755), 0);
    big_ = BigSafetensors(kTensors, 4ull << 20, 'a');  // 64 MiB: 16 reads, so a pause after the first is mid-read
    WriteFile(root_.File("m/model.safetensors"), big_);
    WriteFile(root_.File("small.safetensors"),
              Safetensors(R"({"w":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})", "12345678"));
    ASSERT_TRUE(daemon_.Start()) << ReadFile(daemon_.log_path());
  }

  // Loads `path` with the daemon stopped mid-read (pause point "load-mid-read": bytes read,
  // more to read), runs `swap` there, and lets the load go on. Returns the load's result.
  Result<json> LoadSwappingMidway(const std::string& path, const std::string& name,
                                  const std::function<void()>& swap) {
    testing::PausePointControl pause(daemon_.pause_dir(), "load-mid-read");
    auto load = std::async(std::launch::async, [&]() -> Result<json> {
      auto connection = protocol::DaemonConnection::Open(daemon_.socket());
      if (!connection.ok()) return connection.status();
      return (*connection)->Call("load", json{{"path", path}, {"name", name}});
    });
    EXPECT_TRUE(pause.WaitReached()) << "the load never reached its reads: " << ReadFile(daemon_.log_path());
    swap();
    EXPECT_TRUE(pause.Resume());
    return load.get();
  }

  // The daemon still answers, has published nothing under `name`, left no segment but the
  // ones listed, and still loads a good file.
  void ExpectNothingPublishedAndServing(const std::string& name) {
    auto client = Client::Connect(daemon_.socket());
    ASSERT_TRUE(client.ok()) << "daemon stopped serving: " << ReadFile(daemon_.log_path());
    auto list = (*client)->List();
    ASSERT_TRUE(list.ok());
    for (const auto& c : *list) EXPECT_NE(c.name, name) << "a changed file was published";
    EXPECT_EQ(testing::SegmentCount(daemon_.shm_prefix()), list->size()) << "a partial segment was left";
    auto ok = (*client)->Load(root_.File("small.safetensors"), "small", nullptr);
    ASSERT_TRUE(ok.ok()) << ok.status().ToString();
    ASSERT_TRUE((*client)->Evict("small", false).ok());
  }

  // The load of m/model.safetensors during which `swap` runs, forced mid-read, fails with
  // `expected` in its message and publishes nothing. A build that reads by path, or does
  // not check identities, publishes instead, so the test fails there every time.
  void SwapMidLoadMustFail(const std::function<void()>& swap, const std::string& expected) {
    auto r = LoadSwappingMidway(root_.File("m/model.safetensors"), "raced", swap);
    ASSERT_FALSE(r.ok()) << "the load published although its file was swapped mid-read";
    EXPECT_NE(r.status().message().find(expected), std::string::npos) << r.status().ToString();
    ASSERT_NO_FATAL_FAILURE(ExpectNothingPublishedAndServing("raced"));
  }

  CommandResult CtlWithTimeout(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"timeout", "20", CKPTCTL_BIN, "--socket", daemon_.socket()};
    argv.insert(argv.end(), args.begin(), args.end());
    return testing::RunCommand(argv);
  }

  ScratchDir root_, outside_;
  DaemonProcess daemon_{{"--model-root", root_.path(), "--load-threads", "1"}};
  std::string big_;
};

TEST_F(FilesTest, FileTruncatedAndRegrownDuringTheLoadFailsIt) {
  const std::string path = root_.File("m/model.safetensors");
  SwapMidLoadMustFail(
      [&] {
        // Truncate, then regrow to the same size with other bytes, in place.
        ASSERT_EQ(::truncate(path.c_str(), 0), 0);
        std::string other = big_;
        std::memset(other.data() + other.size() / 2, 'z', other.size() / 2);
        WriteFile(path, other);
      },
      "changed while it was being loaded");
}

TEST_F(FilesTest, FileRenamedOverByAnotherCheckpointDuringTheLoadFailsIt) {
  const std::string path = root_.File("m/model.safetensors");
  const std::string other = BigSafetensors(kTensors, 4ull << 20, 'b');  // same header, foreign bytes
  WriteFile(root_.File("other.safetensors"), other);
  SwapMidLoadMustFail([&] { ASSERT_EQ(::rename(root_.File("other.safetensors").c_str(), path.c_str()), 0); },
                      "changed while it was being loaded");
}

TEST_F(FilesTest, FileSwappedForASymlinkOutsideTheRootsFailsBeforeAndDuringTheLoad) {
  const std::string path = root_.File("m/model.safetensors");
  const std::string secret = outside_.File("secret.safetensors");
  WriteFile(secret, BigSafetensors(kTensors, 4ull << 20, 's'));
  ASSERT_EQ(::chmod(secret.c_str(), 0600), 0);
  SwapMidLoadMustFail(
      [&] {
        ASSERT_EQ(::symlink(secret.c_str(), root_.File("m/link").c_str()), 0);
        ASSERT_EQ(::rename(root_.File("m/link").c_str(), path.c_str()), 0);
      },
      "changed while it was being loaded");
  // Already a symlink when the load starts: refused before anything is read.
  ::unlink(path.c_str());
  ASSERT_EQ(::symlink(secret.c_str(), path.c_str()), 0);
  CommandResult r = CtlWithTimeout({"load", path, "--name", "raced"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("symbolic link"), std::string::npos) << r.err;
  CommandResult folder = CtlWithTimeout({"load", root_.File("m"), "--name", "raced"});
  EXPECT_EQ(folder.exit_code, 1) << folder.err;
  EXPECT_NE(folder.err.find("symbolic link"), std::string::npos) << folder.err;
  ExpectNothingPublishedAndServing("raced");
}

TEST_F(FilesTest, DirectorySwappedForASymlinkFailsBeforeAndDuringTheLoad) {
  ASSERT_EQ(::mkdir(outside_.File("m").c_str(), 0700), 0);
  WriteFile(outside_.File("m/model.safetensors"), BigSafetensors(kTensors, 4ull << 20, 's'));
  SwapMidLoadMustFail(
      [&] {
        ASSERT_EQ(::rename(root_.File("m").c_str(), root_.File("m.old").c_str()), 0);
        ASSERT_EQ(::symlink(outside_.File("m").c_str(), root_.File("m").c_str()), 0);
      },
      "changed while it was being loaded");
  CommandResult r = CtlWithTimeout({"load", root_.File("m/model.safetensors"), "--name", "raced"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("symbolic link"), std::string::npos) << r.err;
  ExpectNothingPublishedAndServing("raced");
}

// A FIFO without a writer, a socket, a character device and a directory named like the
// model file: refused (a hang would run into the 20 s timeout), the daemon keeps serving.
TEST_F(FilesTest, SpecialFilesUnderAModelRootFailAtOnce) {
  ASSERT_EQ(::mkfifo(root_.File("fifo.safetensors").c_str(), 0644), 0);
  ASSERT_EQ(::mkdir(root_.File("fifofolder").c_str(), 0755), 0);
  ASSERT_EQ(::mkfifo(root_.File("fifofolder/model.safetensors").c_str(), 0644), 0);
  ASSERT_EQ(::mkdir(root_.File("dirfolder").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(root_.File("dirfolder/model.safetensors").c_str(), 0755), 0);
  int sock = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, root_.File("sock.safetensors").c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(::bind(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  std::vector<std::pair<std::string, std::string>> cases = {
      {root_.File("fifo.safetensors"), "is a FIFO, not a regular file"},
      {root_.File("fifofolder"), "is a FIFO, not a regular file"},
      {root_.File("dirfolder"), "is a directory, not a regular file"},
      {root_.File("sock.safetensors"), "is a socket, not a regular file"},
  };
  if (::mknod(root_.File("zero.safetensors").c_str(), S_IFCHR | 0644, makedev(1, 5)) == 0) {
    cases.emplace_back(root_.File("zero.safetensors"), "is a character device, not a regular file");
  }
  for (const auto& [path, expected] : cases) {
    CommandResult r = CtlWithTimeout({"load", path, "--name", "special"});
    EXPECT_EQ(r.exit_code, 1) << path << " (124: it hung): " << r.err;
    EXPECT_NE(r.err.find(expected), std::string::npos) << path << ": " << r.err;
  }
  ::close(sock);
  ExpectNothingPublishedAndServing("special");
}

// About 1.5 KB written by real PyTorch: sixteen stride-0 views of a 1-byte storage, 2^60
// bytes each (each passes every per-tensor check), whose sum wraps 64 bits to 0: the
// segment was laid out tiny and the strided gather wrote far past it (SIGSEGV).
TEST_F(FilesTest, StrideZeroViewsWhoseSumWrapsAreAClearError) {
  const std::string path = root_.File("wrap.pt");
  CommandResult w = testing::RunTorchPython(
      "import sys, torch\n"
      "s = torch.zeros(1, dtype=torch.uint8)\n"
      "d = {f'v{i}': s.as_strided((2**(60-i), 2**i), (0, 0)) for i in range(16)}\n"
      "d['ok'] = torch.arange(4, dtype=torch.float32)\n"
      "torch.save(d, sys.argv[1])\n",
      {path});
  ASSERT_EQ(w.exit_code, 0) << w.err;
  ASSERT_LT(ReadFile(path).size(), 2500u);
  for (const std::vector<std::string>& extra : {std::vector<std::string>{}, {"--allow-expansion"}}) {
    std::vector<std::string> args = {"load", path, "--name", "wrap"};
    args.insert(args.end(), extra.begin(), extra.end());
    CommandResult r = CtlWithTimeout(args);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("overflows 64 bits"), std::string::npos) << r.err;
    ASSERT_TRUE(daemon_.Running()) << ReadFile(daemon_.log_path());
  }
  ExpectNothingPublishedAndServing("wrap");
}

// A 64 KiB storage viewed 2048 times with stride 0: 128 MiB in shared memory. Refused by
// default, loaded byte for byte with --allow-expansion.
TEST_F(FilesTest, AnExpansionBombIsRefusedUnlessAllowed) {
  const std::string path = root_.File("bomb.pt");
  CommandResult w = testing::RunTorchPython(
      "import sys, torch\n"
      "s = (torch.arange(65536) % 251).to(torch.uint8)\n"
      "torch.save({'bomb': s.as_strided((2048, 65536), (0, 1))}, sys.argv[1])\n",
      {path});
  ASSERT_EQ(w.exit_code, 0) << w.err;
  CommandResult refused = CtlWithTimeout({"load", path, "--name", "bomb"});
  EXPECT_EQ(refused.exit_code, 1) << refused.err;
  EXPECT_NE(refused.err.find("refused unless an admin allows it"), std::string::npos) << refused.err;
  ExpectNothingPublishedAndServing("bomb");
  CommandResult allowed = CtlWithTimeout({"load", path, "--name", "bomb", "--allow-expansion"});
  ASSERT_EQ(allowed.exit_code, 0) << allowed.err;
  auto client = Client::Connect(daemon_.socket());
  ASSERT_TRUE(client.ok());
  auto ckpt = (*client)->Attach("bomb");
  ASSERT_TRUE(ckpt.ok());
  auto view = (*ckpt)->Tensor("bomb");
  ASSERT_TRUE(view.ok());
  ASSERT_EQ(view->info->nbytes, 2048ull * 65536);
  const auto* bytes = reinterpret_cast<const uint8_t*>(view->data);
  for (uint64_t row : {0ull, 1ull, 2047ull}) {
    for (uint64_t c : {0ull, 250ull, 251ull, 65535ull}) EXPECT_EQ(bytes[row * 65536 + c], c % 251);
  }
}

TEST_F(FilesTest, NamesThatAreNotUtf8OrGivenTwiceAreRefused) {
  // Real PyTorch: a lone surrogate in a key is pickled as invalid UTF-8 (ED B3 BF).
  const std::string surrogate = root_.File("surrogate.pt");
  CommandResult w = testing::RunTorchPython(
      "import sys, torch\ntorch.save({'w\\udcff': torch.ones(2), 'ok': torch.ones(1)}, sys.argv[1])\n", {surrogate});
  ASSERT_EQ(w.exit_code, 0) << w.err;
  const std::string desc = R"({"dtype":"U8","shape":[4],"data_offsets":[0,4]})";
  const std::string desc2 = R"({"dtype":"U8","shape":[4],"data_offsets":[4,8]})";
  WriteFile(root_.File("dup.safetensors"), Safetensors("{\"a\":" + desc + ",\"a\":" + desc2 + "}", "abcdefgh"));
  ASSERT_EQ(::mkdir(root_.File("dupindex").c_str(), 0755), 0);
  WriteFile(root_.File("dupindex/s1.safetensors"), Safetensors("{\"a\":" + desc + "}", "abcd"));
  WriteFile(root_.File("dupindex/s2.safetensors"), Safetensors("{\"b\":" + desc + "}", "efgh"));
  WriteFile(root_.File("dupindex/model.safetensors.index.json"),
            R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors", "a": "s2.safetensors"}})");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {surrogate, "not valid UTF-8"},
      {root_.File("dup.safetensors"), "more than once"},
      {root_.File("dupindex"), "more than once"},
  };
  for (const auto& [path, expected] : cases) {
    CommandResult r = CtlWithTimeout({"load", path, "--name", "names"});
    EXPECT_EQ(r.exit_code, 1) << path << ": " << r.err;
    EXPECT_NE(r.err.find(expected), std::string::npos) << path << ": " << r.err;
    EXPECT_EQ(r.err.find("\xed\xb3\xbf"), std::string::npos) << "raw name bytes in the error";
  }
  ExpectNothingPublishedAndServing("names");
}

// config.json & co. are kept with the checkpoint and read back byte for byte through the
// C++ and C APIs (Python: tests/python/test_side_files.py); a side file that is a symlink
// or larger than 1 MiB is not taken, and the load still succeeds.
TEST_F(FilesTest, SideFilesRoundTripByteForByte) {
  const std::string dir = root_.File("hf");
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  WriteFile(dir + "/model.safetensors",
            Safetensors(R"({"__metadata__":{"format":"pt","note":"caf\u00e9"},"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})",
                        "wxyz"));
  std::string config = "{\"model_type\": \"llama\", \"architectures\": [\"LlamaForCausalLM\"], \"x\": \"\xc3\xa9\"}\n";
  config += std::string(3000, ' ') + "\r\n\t";
  WriteFile(dir + "/config.json", config);
  WriteFile(dir + "/generation_config.json", "{\"do_sample\": true}");
  WriteFile(outside_.File("tok.json"), "{\"secret\": 1}");
  ASSERT_EQ(::symlink(outside_.File("tok.json").c_str(), (dir + "/tokenizer_config.json").c_str()), 0);
  WriteFile(dir + "/special_tokens_map.json", std::string((1 << 20) + 1, ' '));
  CommandResult r = CtlWithTimeout({"load", dir, "--name", "hf"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(ReadFile(daemon_.log_path()).find("tokenizer_config.json skipped"), std::string::npos);
  // The files are gone: clients read only the attachment.
  ASSERT_EQ(::rename(dir.c_str(), root_.File("hf.gone").c_str()), 0);

  auto client = Client::Connect(daemon_.socket());
  ASSERT_TRUE(client.ok());
  auto ckpt = (*client)->Attach("hf");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  EXPECT_EQ((*ckpt)->side_files(), (std::vector<std::string>{"config.json", "generation_config.json"}));
  auto got = (*ckpt)->SideFile("config.json");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(std::string(*got), config);
  EXPECT_EQ(std::string(*(*ckpt)->SideFile("generation_config.json")), "{\"do_sample\": true}");
  EXPECT_EQ((*ckpt)->SideFile("tokenizer_config.json").status().code(), StatusCode::kNotFound);
  EXPECT_EQ((*ckpt)->SideFile("special_tokens_map.json").status().code(), StatusCode::kNotFound);
  EXPECT_EQ((*ckpt)->metadata(), (std::map<std::string, std::string>{{"format", "pt"}, {"note", "caf\xc3\xa9"}}));

  // The C API.
  ckpt_client* c = nullptr;
  ASSERT_EQ(ckpt_connect(daemon_.socket().c_str(), &c), 0) << ckpt_last_error();
  ckpt_checkpoint* h = nullptr;
  ASSERT_EQ(ckpt_attach(c, "hf", &h), 0) << ckpt_last_error();
  ASSERT_EQ(ckpt_side_file_count(h), 2u);
  const char* name = nullptr;
  ASSERT_EQ(ckpt_side_file_name(h, 0, &name), 0);
  EXPECT_STREQ(name, "config.json");
  const void* data = nullptr;
  uint64_t size = 0;
  ASSERT_EQ(ckpt_side_file(h, "config.json", &data, &size), 0);
  EXPECT_EQ(std::string(static_cast<const char*>(data), size), config);
  EXPECT_EQ(ckpt_side_file(h, "tokenizer_config.json", &data, &size), static_cast<int>(StatusCode::kNotFound));
  ASSERT_EQ(ckpt_metadata_count(h), 2u);
  const char *key = nullptr, *value = nullptr;
  ASSERT_EQ(ckpt_metadata_at(h, 1, &key, &value), 0);
  EXPECT_STREQ(key, "note");
  EXPECT_STREQ(value, "caf\xc3\xa9");
  ASSERT_EQ(ckpt_metadata_get(h, "format", &value), 0);
  EXPECT_STREQ(value, "pt");
  ckpt_detach(h);
  ckpt_client_free(c);

  // A sharded index's metadata (non-string values as JSON).
  ASSERT_EQ(::mkdir(root_.File("sharded").c_str(), 0755), 0);
  WriteFile(root_.File("sharded/s1.safetensors"),
            Safetensors(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", "abcd"));
  WriteFile(root_.File("sharded/model.safetensors.index.json"),
            R"({"metadata": {"total_size": 4}, "weight_map": {"a": "s1.safetensors"}})");
  WriteFile(root_.File("sharded/config.json"), "{}");
  ASSERT_EQ(CtlWithTimeout({"load", root_.File("sharded/model.safetensors.index.json"), "--name", "sh"}).exit_code, 0);
  auto sh = (*client)->Attach("sh");
  ASSERT_TRUE(sh.ok());
  EXPECT_EQ((*sh)->metadata(), (std::map<std::string, std::string>{{"total_size", "4"}}));
  EXPECT_EQ(std::string(*(*sh)->SideFile("config.json")), "{}");
}

}  // namespace
}  // namespace ckpt
