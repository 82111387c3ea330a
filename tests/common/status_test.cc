#include "ckpt/status.h"

#include <gtest/gtest.h>

#include <cerrno>

namespace ckpt {
namespace {

Result<int> Half(int v) {
  if (v % 2 != 0) return InvalidArgument("odd: " + std::to_string(v));
  return v / 2;
}

Result<int> Quarter(int v) {
  CKPT_ASSIGN_OR_RETURN(int half, Half(v));
  CKPT_ASSIGN_OR_RETURN(int quarter, Half(half));
  return quarter;
}

TEST(StatusTest, OkAndErrors) {
  EXPECT_TRUE(Status::Ok().ok());
  EXPECT_EQ(Status::Ok().ToString(), "ok");
  Status s = NotFound("no such thing");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.ToString(), "not_found: no such thing");
  EXPECT_EQ(s.WithContext("loading x").message(), "loading x: no such thing");
  EXPECT_TRUE(Status::Ok().WithContext("ctx").ok());
}

TEST(StatusTest, CodeNamesRoundTrip) {
  for (int c = 0; c <= static_cast<int>(StatusCode::kCancelled); ++c) {
    auto code = static_cast<StatusCode>(c);
    EXPECT_EQ(StatusCodeFromName(StatusCodeName(code)), code);
  }
  EXPECT_EQ(StatusCodeFromName("no-such-code"), StatusCode::kInternal);
}

TEST(StatusTest, ResultPropagates) {
  EXPECT_EQ(*Quarter(8), 2);
  auto r = Quarter(6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "odd: 3");
  EXPECT_EQ(ErrnoError("open x", ENOENT).message(), "open x: No such file or directory");
}

TEST(StatusTest, ErrnoErrorIsTheOneMappingOfErrnoToCodes) {
  for (int err : {EMFILE, ENFILE, ENOSPC, EDQUOT}) {
    EXPECT_EQ(ErrnoError("x", err).code(), StatusCode::kResourceExhausted) << err;
  }
  for (int err : {EACCES, EPERM, EROFS}) EXPECT_EQ(ErrnoError("x", err).code(), StatusCode::kPermissionDenied) << err;
  for (int err : {ENOENT, EIO, EISDIR, EINVAL, ENOTDIR, EEXIST}) {
    EXPECT_EQ(ErrnoError("x", err).code(), StatusCode::kIoError) << err;
  }
  EXPECT_EQ(ErrnoError("write f", ENOSPC).message(), "write f: No space left on device");
}

}  // namespace
}  // namespace ckpt
