// ModelRoots: paths beneath the roots are opened from the root's descriptor without
// following any link; "..", symlinks (leading out or not), paths elsewhere and files that
// are not regular files or directories are refused, at once.
#include "daemon/model_roots.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include "support/test_env.h"

namespace ckpt::daemon {
namespace {

// "Outside the model roots" says which roots there are and how to get beneath one.
TEST(ModelRootsTest, APathOutsideEveryRootIsRefusedNamingTheRoots) {
  testing::ScratchDir first, second, outside;
  testing::WriteFile(outside.File("m.safetensors"), "x");
  auto roots = ModelRoots::Create({first.path(), second.path() + "/"});
  ASSERT_TRUE(roots.ok()) << roots.status().ToString();
  const Status refused = (*roots)->Open(outside.File("m.safetensors")).status();
  EXPECT_EQ(refused.code(), StatusCode::kPermissionDenied);
  EXPECT_NE(refused.message().find("is outside the model roots (" + first.path() + ", " + second.path() + ")"),
            std::string::npos)
      << refused.message();
  EXPECT_NE(refused.message().find("--model-root"), std::string::npos) << refused.message();
}

TEST(ModelRootsTest, ConfinesLoadsToTheRootsWithoutFollowingLinks) {
  testing::ScratchDir root, outside;
  testing::WriteFile(root.File("a.safetensors"), "x");
  testing::WriteFile(outside.File("s.safetensors"), "x");
  ASSERT_EQ(::mkdir(root.File("d").c_str(), 0755), 0);
  testing::WriteFile(root.File("d/b.safetensors"), "y");
  ASSERT_EQ(::symlink(outside.File("s.safetensors").c_str(), root.File("out").c_str()), 0);
  ASSERT_EQ(::symlink(root.File("a.safetensors").c_str(), root.File("d/in").c_str()), 0);
  ASSERT_EQ(::symlink(root.File("d").c_str(), root.File("dirlink").c_str()), 0);
  auto roots = ModelRoots::Create({root.path()});
  ASSERT_TRUE(roots.ok());
  auto a = (*roots)->Open(root.File("a.safetensors"));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_NE(a->file, nullptr);
  struct stat st;
  ASSERT_EQ(::stat(root.File("a.safetensors").c_str(), &st), 0);
  EXPECT_EQ(a->file->identity.ino, st.st_ino);
  EXPECT_EQ(a->file->identity.size, 1u);
  EXPECT_TRUE((*roots)->Open(root.File("./a.safetensors")).ok());
  EXPECT_TRUE((*roots)->Open(root.path() + "//d/b.safetensors").ok());
  auto folder = (*roots)->Open(root.File("d"));
  ASSERT_TRUE(folder.ok());
  EXPECT_EQ(folder->file, nullptr);
  EXPECT_TRUE(folder->OpenMember("b.safetensors").ok());
  EXPECT_EQ(folder->OpenMember("in").status().code(), StatusCode::kPermissionDenied);
  // Links are refused, wherever they lead and wherever they are in the path.
  EXPECT_EQ((*roots)->Open(root.File("out")).status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ((*roots)->Open(root.File("d/in")).status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ((*roots)->Open(root.File("dirlink/b.safetensors")).status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ((*roots)->Open(root.File("d/../a.safetensors")).status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ((*roots)->Open(outside.File("s.safetensors")).status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ((*roots)->Open(root.File("missing")).status().code(), StatusCode::kNotFound);
  EXPECT_EQ((*roots)->Open("relative").status().code(), StatusCode::kInvalidArgument);
  // A root that is a prefix of another directory's name does not admit it.
  EXPECT_EQ((*roots)->Open(root.path() + "x/a").status().code(), StatusCode::kPermissionDenied);
  EXPECT_FALSE(ModelRoots::Create({root.File("a.safetensors")}).ok());
  auto open = ModelRoots::Create({});
  ASSERT_TRUE(open.ok());
  EXPECT_TRUE((*open)->Open(outside.File("s.safetensors")).ok());
  // Without roots the last component is still not followed.
  EXPECT_EQ((*open)->Open(root.File("out")).status().code(), StatusCode::kPermissionDenied);
}

// A FIFO, a socket, a character device and a directory where a file is expected: refused
// at once (opened with O_PATH only, so a FIFO without a writer never blocks).
TEST(ModelRootsTest, SpecialFilesAreRefusedAtOnce) {
  testing::ScratchDir root;
  ASSERT_EQ(::mkfifo(root.File("fifo.safetensors").c_str(), 0644), 0);
  int sock = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(sock, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string sock_path = root.File("sock.safetensors");
  ASSERT_LT(sock_path.size(), sizeof(addr.sun_path));
  std::strcpy(addr.sun_path, sock_path.c_str());
  ASSERT_EQ(::bind(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::mkdir(root.File("folder").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(root.File("folder/model.safetensors").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(root.File("fifofolder").c_str(), 0755), 0);
  ASSERT_EQ(::mkfifo(root.File("fifofolder/model.safetensors").c_str(), 0644), 0);
  auto roots = ModelRoots::Create({root.path()});
  ASSERT_TRUE(roots.ok());
  auto fifo = (*roots)->Open(root.File("fifo.safetensors"));
  EXPECT_EQ(fifo.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(fifo.status().message().find("is a FIFO, not a regular file"), std::string::npos) << fifo.status().ToString();
  auto s = (*roots)->Open(sock_path);
  EXPECT_EQ(s.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.status().message().find("a socket"), std::string::npos) << s.status().ToString();
  auto dev = ModelRoots::Create({"/dev"});
  ASSERT_TRUE(dev.ok());
  auto zero = (*dev)->Open("/dev/zero");
  EXPECT_EQ(zero.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(zero.status().message().find("a character device"), std::string::npos) << zero.status().ToString();
  auto folder = (*roots)->Open(root.File("folder"));
  ASSERT_TRUE(folder.ok());
  auto member = folder->OpenMember("model.safetensors");
  EXPECT_EQ(member.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(member.status().message().find("a directory"), std::string::npos) << member.status().ToString();
  auto fifo_folder = (*roots)->Open(root.File("fifofolder"));
  ASSERT_TRUE(fifo_folder.ok());
  EXPECT_EQ(fifo_folder->OpenMember("model.safetensors").status().code(), StatusCode::kFailedPrecondition);
  ::close(sock);
}

}  // namespace
}  // namespace ckpt::daemon
