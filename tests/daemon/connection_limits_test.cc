// ConnectionLimits: no role, per-uid limit, the shared pool and the admins' reserve.
#include "daemon/connection_limits.h"

#include <gtest/gtest.h>

namespace ckpt::daemon {
namespace {

PeerCredentials Uid(uint32_t uid) { return PeerCredentials{1, uid, uid, {}}; }

TEST(ConnectionLimitsTest, NoRoleNeverGetsASlot) {
  ConnectionLimits limits({4, 4, 2});
  EXPECT_EQ(limits.Admit(Uid(1000), Role::kNone).code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(limits.total(), 0);
}

TEST(ConnectionLimitsTest, PerUidLimitLeavesRoomForOthers) {
  ConnectionLimits limits({10, 3, 2});
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(limits.Admit(Uid(1000), Role::kReader).ok());
  EXPECT_EQ(limits.Admit(Uid(1000), Role::kReader).code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(limits.Admit(Uid(1001), Role::kReader).ok());
  limits.Release(1000);
  EXPECT_TRUE(limits.Admit(Uid(1000), Role::kReader).ok());
  EXPECT_EQ(limits.total(), 4);
}

TEST(ConnectionLimitsTest, AdminsHaveReservedSlotsWhenThePoolIsFull) {
  ConnectionLimits limits({4, 4, 2});
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(limits.Admit(Uid(1000), Role::kReader).ok());
  EXPECT_EQ(limits.Admit(Uid(1001), Role::kReader).code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(limits.Admit(Uid(0), Role::kAdmin).ok());
  EXPECT_TRUE(limits.Admit(Uid(0), Role::kAdmin).ok());
  EXPECT_EQ(limits.Admit(Uid(0), Role::kAdmin).code(), StatusCode::kResourceExhausted);  // reserve used up
  EXPECT_EQ(limits.total(), 6);
  // An admin that itself fills the pool gets no reserve beyond its own share.
  ConnectionLimits own({4, 8, 2});
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(own.Admit(Uid(0), Role::kAdmin).ok());
  EXPECT_EQ(own.Admit(Uid(0), Role::kAdmin).code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(own.Admit(Uid(5), Role::kAdmin).ok());  // another admin still gets in
}

}  // namespace
}  // namespace ckpt::daemon
