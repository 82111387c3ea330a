// Every format through the real ckptd and libckptclient: checkpoints written by real
// PyTorch (tests/format/torch_cases.py) must read back bit for bit; refused files get a
// clear error, run nothing, leave nothing behind, and the daemon keeps serving.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "ckpt/client.h"
#include "format/torch_cases.h"
#include "format/zip_reader.h"
#include "shm/shm_object.h"
#include "support/test_env.h"

namespace ckpt {
namespace {

using nlohmann::json;
using testing::DaemonProcess;
using testing::ReadFile;

class FormatsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TorchCasesDir();
    ASSERT_TRUE(daemon_.Start()) << ReadFile(daemon_.log_path());
    auto client = Client::Connect(daemon_.socket());
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    client_ = std::move(client).value();
  }

  // Loads `path` as `name` and compares every tensor with ref/<ref_case>.
  void LoadAndCompare(const std::string& path, const std::string& name, const std::string& ref_case,
                      const std::string& format) {
    auto summary = client_->Load(path, name);
    ASSERT_TRUE(summary.ok()) << path << ": " << summary.status().ToString();
    auto ckpt = client_->Attach(name);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
    EXPECT_TRUE((*ckpt)->Verify().ok());
    const json manifest = json::parse(ReadFile(dir_ + "/ref/" + ref_case + "/manifest.json"));
    EXPECT_EQ((*ckpt)->tensors().size(), manifest.size());
    for (auto it = manifest.begin(); it != manifest.end(); ++it) {
      auto view = (*ckpt)->Tensor(it.key());
      ASSERT_TRUE(view.ok()) << it.key() << ": " << view.status().ToString();
      EXPECT_STREQ(DTypeName(view->info->dtype), it.value()["dtype"].get<std::string>().c_str()) << it.key();
      EXPECT_EQ(view->info->shape, it.value()["shape"].get<std::vector<int64_t>>()) << it.key();
      const std::string want = ReadFile(dir_ + "/ref/" + ref_case + "/" + it.key() + ".bin");
      ASSERT_EQ(view->info->nbytes, want.size()) << it.key();
      EXPECT_EQ(std::memcmp(view->data, want.data(), want.size()), 0) << it.key() << " differs from PyTorch's bytes";
    }
    auto list = client_->List();
    ASSERT_TRUE(list.ok());
    for (const auto& c : *list) {
      if (c.name == name) {
        EXPECT_EQ(c.format, format);
      }
    }
  }

  std::string dir_;
  DaemonProcess daemon_;
  std::unique_ptr<Client> client_;
};

TEST_F(FormatsTest, EveryDtypeBitForBit) { LoadAndCompare(dir_ + "/all_dtypes.pt", "dtypes", "all_dtypes", "pytorch"); }

TEST_F(FormatsTest, ViewsAreStoredContiguousAndTiedWeightsOnce) {
  LoadAndCompare(dir_ + "/views.bin", "views", "views", "pytorch");
  auto ckpt = client_->Attach("views");
  ASSERT_TRUE(ckpt.ok());
  auto embed = (*ckpt)->Tensor("embed.weight");
  auto head = (*ckpt)->Tensor("lm_head.weight");
  ASSERT_TRUE(embed.ok() && head.ok());
  EXPECT_EQ(embed->data, head->data) << "tied weights must share one copy";
}

TEST_F(FormatsTest, ModuleStateDictAndParameters) {
  LoadAndCompare(dir_ + "/module.pt", "module", "module", "pytorch");
  LoadAndCompare(dir_ + "/params.pt", "params", "params", "pytorch");
}

TEST_F(FormatsTest, ShardedFoldersAndFolderWithOneBin) {
  LoadAndCompare(dir_ + "/sharded_st", "st", "sharded_st", "safetensors-sharded");
  LoadAndCompare(dir_ + "/sharded_bin/pytorch_model.bin.index.json", "bin", "sharded_bin", "pytorch-sharded");
  LoadAndCompare(dir_ + "/bin_folder", "binfolder", "sharded_st", "pytorch");
}

TEST_F(FormatsTest, CtlLoadsFoldersAndNamesThemAfterTheFolder) {
  testing::CommandResult r = daemon_.Ctl({"load", dir_ + "/sharded_bin/"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("loaded 'sharded_bin'"), std::string::npos) << r.out;
  r = daemon_.Ctl({"load", dir_ + "/sharded_st/model.safetensors.index.json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("loaded 'sharded_st'"), std::string::npos) << r.out;
  r = daemon_.Ctl({"load", dir_ + "/views.bin"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("loaded 'views'"), std::string::npos) << r.out;
}

// Packed sub-byte floats (safetensors F4, F6_*; torch cannot write them, so the file is
// made here): stored and attached byte for byte, taken whole, never split.
TEST_F(FormatsTest, SubByteDtypesAreStoredWholeAndRefuseShards) {
  testing::ScratchDir files;
  const std::string header = R"({"f4":{"dtype":"F4","shape":[4,6],"data_offsets":[0,12]},)"
                             R"("f6":{"dtype":"F6_E3M2","shape":[2,4],"data_offsets":[12,18]}})";
  std::string image(8, '\0');
  for (int i = 0; i < 8; ++i) image[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  image += header;
  for (int i = 0; i < 18; ++i) image.push_back(static_cast<char>(0x11 * i + 3));
  testing::WriteFile(files.File("packed.safetensors"), image);
  auto summary = client_->Load(files.File("packed.safetensors"), "packed");
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  auto ckpt = client_->Attach("packed");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  EXPECT_TRUE((*ckpt)->Verify().ok());
  auto f4 = (*ckpt)->Tensor("f4");
  ASSERT_TRUE(f4.ok());
  EXPECT_EQ(f4->info->dtype, DType::kF4);
  EXPECT_EQ(f4->info->shape, (std::vector<int64_t>{4, 6}));
  ASSERT_EQ(f4->info->nbytes, 12u);
  EXPECT_EQ(std::memcmp(f4->data, image.data() + 8 + header.size(), 12), 0);
  auto f6 = (*ckpt)->Tensor("f6");
  ASSERT_TRUE(f6.ok());
  ASSERT_EQ(f6->info->nbytes, 6u);
  EXPECT_EQ(std::memcmp(f6->data, image.data() + 8 + header.size() + 12, 6), 0);
  auto whole = (*ckpt)->PlanShard("f4", ShardSpec::Replicate());
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  EXPECT_EQ(whole->nbytes, 12u);
  auto split = (*ckpt)->PlanShard("f4", ShardSpec::Split(0, 0, 2));
  EXPECT_EQ(split.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(split.status().message().find("only be taken whole"), std::string::npos) << split.status().ToString();
  EXPECT_EQ((*ckpt)->PlanShard("f6", ShardSpec::FlatPartition(0, 2)).status().code(), StatusCode::kUnsupported);
}

// A zip member whose bytes disagree with its CRC-32 (real torch.save files, one byte
// flipped): the load fails naming the member, nothing is published, the daemon serves.
// Every storage record of views.bin (storages shared by several views: read again for
// the check) and of module.pt (one storage per tensor: checked as its reads land), and
// data.pkl (checked at plan time, before the pickle is parsed).
TEST_F(FormatsTest, AZipMemberWithABadCrcIsRefusedNamingIt) {
  ASSERT_TRUE(client_->Load(dir_ + "/module.pt", "good").ok());
  testing::ScratchDir scratch;
  for (const char* file : {"views.bin", "module.pt"}) {
    const std::string original = ReadFile(dir_ + "/" + file);
    auto read = [&](void* buf, size_t n, uint64_t off) -> Status {
      if (off > original.size() || n > original.size() - off) return Corrupt("past the end");
      std::memcpy(buf, original.data() + off, n);
      return Status::Ok();
    };
    auto zip = format::ZipReader::Create(read, original.size(), file);
    ASSERT_TRUE(zip.ok()) << zip.status().ToString();
    int checked = 0;
    auto before = client_->List();
    ASSERT_TRUE(before.ok());
    for (const format::ZipEntry& e : (*zip)->entries()) {
      const bool storage = e.name.find("/data/") != std::string::npos;
      const bool pickle = e.name.size() > 9 && e.name.compare(e.name.size() - 9, 9, "/data.pkl") == 0;
      if ((!storage && !pickle) || e.size == 0) continue;
      SCOPED_TRACE(std::string(file) + " " + e.name);
      std::string damaged = original;
      damaged[e.data_offset + e.size / 2] ^= 0x01;
      const std::string path = scratch.File(std::string("damaged-") + std::to_string(checked++) + "-" + file);
      testing::WriteFile(path, damaged);
      auto r = client_->Load(path, "damaged");
      ASSERT_FALSE(r.ok()) << "loaded with a bad CRC";
      EXPECT_EQ(r.status().code(), StatusCode::kCorrupt) << r.status().ToString();
      EXPECT_NE(r.status().message().find("zip member '" + e.name + "' is damaged"), std::string::npos)
          << r.status().message();
      auto list = client_->List();
      ASSERT_TRUE(list.ok()) << "daemon stopped serving";
      ASSERT_EQ(list->size(), before->size());
      EXPECT_TRUE(testing::ListSegments(daemon_.shm_prefix(), "damaged").empty());
    }
    EXPECT_GE(checked, 3) << file;
    // The file as torch wrote it loads, CRCs and all.
    const std::string intact = scratch.File(std::string("intact-") + file);
    testing::WriteFile(intact, original);
    EXPECT_TRUE(client_->Load(intact, std::string("intact-") + (file[0] == 'v' ? "views" : "module")).ok());
  }
}

TEST_F(FormatsTest, RefusedFilesLeaveTheDaemonServing) {
  ASSERT_TRUE(client_->Load(dir_ + "/module.pt", "good").ok());
  for (const char* file : {"legacy.pt", "evil.pt", "eval.pt", "nested.pt", "compressed.pt", "bigendian.pt"}) {
    auto r = client_->Load(dir_ + "/" + file, "bad");
    ASSERT_FALSE(r.ok()) << file;
    EXPECT_EQ(r.status().code(), StatusCode::kUnsupported) << file << ": " << r.status().ToString();
    EXPECT_NE(r.status().message().find(file), std::string::npos) << r.status().message();
  }
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/PWNED")) << "a pickle ran a command";
  auto list = client_->List();
  ASSERT_TRUE(list.ok()) << "daemon stopped serving";
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].name, "good");
  EXPECT_TRUE(testing::ListSegments(daemon_.shm_prefix(), "bad").empty());
}

}  // namespace
}  // namespace ckpt
