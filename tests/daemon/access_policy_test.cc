// ResolveGroup: names from the group database, and all-digit text that names no group as a
// numeric gid (a daemon container whose /etc/group lacks the pods' group; docs/containers.md).
#include "daemon/access_policy.h"

#include <grp.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

namespace ckpt::daemon {
namespace {

TEST(ResolveGroupTest, EmptyIsNotConfigured) {
  auto r = ResolveGroup("");
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_value());
}

TEST(ResolveGroupTest, NamesComeFromTheGroupDatabase) {
  auto r = ResolveGroup("root");  // every Debian system has it, gid 0
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(r->has_value());
  EXPECT_EQ(**r, 0u);
  auto missing = ResolveGroup("no-such-group-ckpt");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

TEST(ResolveGroupTest, DigitsThatNameNoGroupAreAGid) {
  ASSERT_EQ(::getgrnam("61237"), nullptr);  // no group of that name here
  auto r = ResolveGroup("61237");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(r->has_value());
  EXPECT_EQ(**r, 61237u);
  auto zero = ResolveGroup("0");
  ASSERT_TRUE(zero.ok());
  EXPECT_EQ(**zero, 0u);
  // (gid_t)-1 is "no change", never a group; longer digit runs are out of range too.
  EXPECT_EQ(ResolveGroup("4294967295").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveGroup("99999999999").status().code(), StatusCode::kNotFound);
  // Not all digits: still a name only.
  EXPECT_EQ(ResolveGroup("61237x").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(ResolveGroup("-1").status().code(), StatusCode::kNotFound);
}

TEST(ResolveGroupTest, PolicyTakesANumericReaderGroup) {
  auto p = AccessPolicy::Create("", "61237", "");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ((*p)->RoleOf(PeerCredentials{0, 61236, 61237, {}}), Role::kReader);
  EXPECT_EQ((*p)->RoleOf(PeerCredentials{0, 61238, 61239, {}}), Role::kNone);
}

TEST(ResolveGroupTest, SupplementaryGroupsTheKernelReportsCount) {
  auto p = AccessPolicy::Create("", "61237", "");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  // uid 61240 has no passwd entry: only the groups from SO_PEERGROUPS can place it.
  EXPECT_EQ((*p)->RoleOf(PeerCredentials{0, 61240, 61241, {61241, 61237}}), Role::kReader);
  EXPECT_EQ((*p)->RoleOf(PeerCredentials{0, 61240, 61241, {61241, 61239}}), Role::kNone);
}

TEST(ResolveGroupTest, PeerOfReportsThisProcesssGroups) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  auto peer = PeerOf(sv[0]);
  ::close(sv[0]);
  ::close(sv[1]);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  EXPECT_EQ(peer->uid, ::getuid());
  EXPECT_EQ(peer->gid, ::getgid());
  const int n = ::getgroups(0, nullptr);
  ASSERT_GE(n, 0);
  std::vector<gid_t> mine(static_cast<size_t>(n));
  ASSERT_EQ(::getgroups(n, mine.data()), n);
  std::vector<uint32_t> want(mine.begin(), mine.end());
  std::vector<uint32_t> got = peer->groups;
  std::sort(want.begin(), want.end());
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace ckpt::daemon
