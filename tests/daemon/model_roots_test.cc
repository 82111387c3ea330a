// ModelRoots: paths beneath the roots pass (canonicalised); "..", symlinks leading out and
// paths elsewhere are refused.
#include "daemon/model_roots.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "support/test_env.h"

namespace ckpt::daemon {
namespace {

TEST(ModelRootsTest, ConfinesLoadsToTheRoots) {
  testing::ScratchDir root, outside;
  testing::WriteFile(root.File("a.safetensors"), "x");
  testing::WriteFile(outside.File("s.safetensors"), "x");
  ASSERT_EQ(::mkdir(root.File("d").c_str(), 0755), 0);
  ASSERT_EQ(::symlink(outside.File("s.safetensors").c_str(), root.File("out").c_str()), 0);
  ASSERT_EQ(::symlink(root.File("a.safetensors").c_str(), root.File("d/in").c_str()), 0);
  auto roots = ModelRoots::Create({root.path()});
  ASSERT_TRUE(roots.ok());
  EXPECT_EQ(*(*roots)->Check(root.File("a.safetensors")), root.File("a.safetensors"));
  EXPECT_EQ(*(*roots)->Check(root.File("d/in")), root.File("a.safetensors"));
  EXPECT_EQ(*(*roots)->Check(root.File("./a.safetensors")), root.File("a.safetensors"));
  EXPECT_EQ((*roots)->Check(root.File("out")).status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ((*roots)->Check(root.File("d/../a.safetensors")).status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ((*roots)->Check(outside.File("s.safetensors")).status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ((*roots)->Check(root.File("missing")).status().code(), StatusCode::kNotFound);
  EXPECT_EQ((*roots)->Check("relative").status().code(), StatusCode::kInvalidArgument);
  // A root that is a prefix of another directory's name does not admit it.
  EXPECT_EQ((*roots)->Check(root.path() + "x/a").status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(ModelRoots::Create({root.File("a.safetensors")}).ok());
  auto open = ModelRoots::Create({});
  ASSERT_TRUE(open.ok());
  EXPECT_TRUE((*open)->Check(outside.File("s.safetensors")).ok());
}

}  // namespace
}  // namespace ckpt::daemon
