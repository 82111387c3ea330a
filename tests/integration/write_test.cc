// The write path (issue 15) against the real ckptd: ckpt::Writer in one and in several
// parts, writers killed, daemons killed, a raw-protocol writer trying to change a
// published generation, bad declarations and bytes, roles and the budget, and readers
// taking another sharding of what was written.
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <pwd.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <future>
#include <nlohmann/json.hpp>
#include <thread>

#include "ckpt/ckpt.h"
#include "ckpt/client.h"
#include "ckpt/writer.h"
#include "integration/ops_helpers.h"
#include "protocol/messages.h"
#include "protocol/wire.h"
#include "support/test_env.h"

namespace ckpt {
namespace {

using nlohmann::json;
using testing::DaemonProcess;
using testing::ListSegments;
using testing::TempGroup;
using testing::TempUser;
using testing::WaitFor;

constexpr int64_t kRows = 64, kCols = 48;

// The global test tensor "w" (F32 [kRows, kCols]) and "z" (F32 [1000], ZeRO-partitioned).
float W(int64_t r, int64_t c) { return static_cast<float>(r * 1000 + c) + 0.25f; }
float Z(int64_t i) { return static_cast<float>(i) * -0.5f; }

std::vector<float> WRows(int64_t r0, int64_t rows) {
  std::vector<float> out;
  for (int64_t r = r0; r < r0 + rows; ++r)
    for (int64_t c = 0; c < kCols; ++c) out.push_back(W(r, c));
  return out;
}

PieceSource FromVector(std::shared_ptr<std::vector<float>> v) {
  return [v](uint64_t offset, void* dst, uint64_t size) {
    std::memcpy(dst, reinterpret_cast<const std::byte*>(v->data()) + offset, size);
    return Status::Ok();
  };
}

class WriteTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(daemon_.Start()); }

  std::unique_ptr<Writer> MakeWriter(const std::string& name, int64_t part = 0, int64_t parts = 1,
                                     const std::string& job = "", double timeout = 30) {
    WriterOptions o;
    o.part = part;
    o.parts = parts;
    o.job = job;
    o.timeout_s = timeout;
    o.slot_bytes = 4096;  // small slots: many chunks, several ring turns
    o.ring_slots = 3;
    auto w = Writer::Create(daemon_.socket(), name, o);
    EXPECT_TRUE(w.ok()) << w.status().ToString();
    return std::move(w).value();
  }

  // Rows [part * rows/parts, ...) of "w" and the flat range of "z" of part `part`.
  void AddPart(Writer* w, int64_t part, int64_t parts) {
    const int64_t rows = kRows / parts;
    auto rows_data = std::make_shared<std::vector<float>>(WRows(part * rows, rows));
    ASSERT_TRUE(w->AddBox("w", DType::kF32, {kRows, kCols}, {part * rows, 0}, {rows, kCols}, FromVector(rows_data)).ok());
    const int64_t per = (1000 + parts - 1) / parts;
    const int64_t start = std::min<int64_t>(1000, part * per), end = std::min<int64_t>(1000, start + per);
    auto z = std::make_shared<std::vector<float>>();
    for (int64_t i = start; i < end; ++i) z->push_back(Z(i));
    ASSERT_TRUE(w->AddFlat("z", DType::kF32, {1000}, static_cast<uint64_t>(start), static_cast<uint64_t>(end - start),
                           FromVector(z))
                    .ok());
  }

  std::unique_ptr<Client> Connect() {
    auto c = Client::Connect(daemon_.socket());
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return std::move(c).value();
  }

  // Nothing visible and nothing held: no checkpoint of that name, no load in progress, no
  // segment file, no memory counted beyond the published checkpoints'.
  void ExpectNothingLeft(const std::string& name) {
    auto client = Connect();
    auto list = client->ListAll();
    ASSERT_TRUE(list.ok());
    for (const auto& c : list->checkpoints) EXPECT_NE(c.name, name);
    EXPECT_TRUE(WaitFor([&] { return ListSegments(daemon_.shm_prefix(), name + ".").empty(); }, 5000))
        << "segment files of '" << name << "' left";
    EXPECT_TRUE(WaitFor([&] {
      auto st = client->GetStatus();
      if (!st.ok()) return false;
      uint64_t published = 0;  // what the checkpoints still there hold
      for (const auto& c : st->checkpoint_list) published += c.segment_bytes;
      for (const auto& c : st->retired) published += c.segment_bytes;
      return st->loading == 0 && st->memory_used_bytes == published;
    }, 5000));
  }

  // Checks the published "w" and "z" against the pattern, through a reader's attach.
  void ExpectPattern(const std::string& name) {
    auto ckpt = Connect()->Attach(name);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
    auto w = (*ckpt)->Tensor("w");
    ASSERT_TRUE(w.ok());
    EXPECT_EQ(w->info->shape, (std::vector<int64_t>{kRows, kCols}));
    const float* f = reinterpret_cast<const float*>(w->data);
    uint64_t wrong = 0;
    for (int64_t r = 0; r < kRows; ++r)
      for (int64_t c = 0; c < kCols; ++c) wrong += f[r * kCols + c] != W(r, c);
    EXPECT_EQ(wrong, 0u);
    auto z = (*ckpt)->Tensor("z");
    ASSERT_TRUE(z.ok());
    const float* zf = reinterpret_cast<const float*>(z->data);
    wrong = 0;
    for (int64_t i = 0; i < 1000; ++i) wrong += zf[i] != Z(i);
    EXPECT_EQ(wrong, 0u);
    EXPECT_TRUE((*ckpt)->Verify().ok());
  }

  // Commits `parts` parts on threads of this process; returns each part's result.
  std::vector<Result<LoadResult>> CommitParts(const std::string& name, int64_t parts, const std::string& job,
                                              const std::function<void(Writer*, int64_t)>& add) {
    std::vector<std::unique_ptr<Writer>> writers;
    for (int64_t p = 0; p < parts; ++p) {
      writers.push_back(MakeWriter(name, p, parts, job));
      add(writers.back().get(), p);
    }
    std::vector<std::future<Result<LoadResult>>> futures;
    for (auto& w : writers) futures.push_back(std::async(std::launch::async, [&w] { return w->Commit(); }));
    std::vector<Result<LoadResult>> out;
    for (auto& f : futures) out.push_back(f.get());
    return out;
  }

  DaemonProcess daemon_{{"--load-threads", "2"}};
};

TEST_F(WriteTest, OneProcessPublishesAGenerationLikeALoad) {
  auto w = MakeWriter("one");
  AddPart(w.get(), 0, 1);
  ASSERT_TRUE(w->AddSideFile("config.json", "{\"a\": 1}").ok());
  auto r = w->Commit();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->checkpoint.name, "one");
  EXPECT_EQ(r->checkpoint.format, "published");
  EXPECT_EQ(r->checkpoint.tensor_count, 2u);
  ExpectPattern("one");
  auto ckpt = Connect()->Attach("one");
  ASSERT_TRUE(ckpt.ok());
  auto side = (*ckpt)->SideFile("config.json");
  ASSERT_TRUE(side.ok());
  EXPECT_EQ(*side, "{\"a\": 1}");
  // The daemon's own re-hash agrees with the checksums it computed while publishing.
  auto verified = Connect()->Verify("one");
  ASSERT_TRUE(verified.ok());
  EXPECT_TRUE(verified->passed);
  // Its generation comes from the same counter as loads.
  auto second = MakeWriter("two");
  AddPart(second.get(), 0, 1);
  auto r2 = second->Commit();
  ASSERT_TRUE(r2.ok());
  EXPECT_GT(r2->checkpoint.generation, r->checkpoint.generation);
}

TEST_F(WriteTest, FourPartsReadBackAsTwoColumnShardsAndZeroPartitions) {
  auto results = CommitParts("four", 4, "job-four", [&](Writer* w, int64_t p) { AddPart(w, p, 4); });
  for (auto& r : results) ASSERT_TRUE(r.ok()) << r.status().ToString();
  // Every part got the same generation.
  for (auto& r : results) EXPECT_EQ(r->checkpoint.generation, results[0]->checkpoint.generation);
  ExpectPattern("four");
  auto ckpt = Connect()->Attach("four");
  ASSERT_TRUE(ckpt.ok());
  // TP=2 along dim 1 (written along dim 0).
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<float> shard(kRows * kCols / 2);
    ASSERT_TRUE((*ckpt)->CopyShard("w", ShardSpec::Split(1, rank, 2), shard.data(), shard.size() * 4).ok());
    uint64_t wrong = 0;
    for (int64_t r = 0; r < kRows; ++r)
      for (int64_t c = 0; c < kCols / 2; ++c) wrong += shard[r * (kCols / 2) + c] != W(r, rank * (kCols / 2) + c);
    EXPECT_EQ(wrong, 0u) << "rank " << rank;
  }
  // A ZeRO-3 partition of "z" for world 3 (written for world 4): ceil(1000/3) = 334 each.
  for (int rank = 0; rank < 3; ++rank) {
    std::vector<float> part(334);
    ASSERT_TRUE((*ckpt)->CopyShard("z", ShardSpec::FlatPartition(rank, 3), part.data(), part.size() * 4).ok());
    uint64_t wrong = 0;
    for (int64_t i = 0; i < 334; ++i) {
      const int64_t g = rank * 334 + i;
      wrong += part[i] != (g < 1000 ? Z(g) : 0.0f);
    }
    EXPECT_EQ(wrong, 0u) << "rank " << rank;
  }
}

TEST_F(WriteTest, WriterKilledBeforePublishLeavesNothingAndFreesItsMemory) {
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t child = ::fork();
  if (child == 0) {
    ::close(ready[0]);
    WriterOptions o;
    o.slot_bytes = 4096;
    auto w = Writer::Create(daemon_.socket(), "killed", o);
    if (!w.ok()) ::_exit(2);
    auto big = std::make_shared<std::vector<float>>(4 << 20, 1.0f);  // 16 MiB
    int calls = 0;
    (void)(*w)->AddBox("big", DType::kF32, {4 << 20}, {}, {}, [&, big](uint64_t off, void* dst, uint64_t n) {
      std::memcpy(dst, reinterpret_cast<const std::byte*>(big->data()) + off, n);
      if (++calls == 8) {
        (void)!::write(ready[1], "x", 1);  // some chunks are in; now wait to be killed
        ::pause();
      }
      return Status::Ok();
    });
    (void)(*w)->Commit();
    ::_exit(3);
  }
  ::close(ready[1]);
  char c;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ::close(ready[0]);
  // Mid-write: the segment exists and its memory is counted, but nothing is listed.
  EXPECT_EQ(ListSegments(daemon_.shm_prefix(), "killed.").size(), 1u);
  auto st = Connect()->GetStatus();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->loading, 1u);
  EXPECT_GE(st->memory_used_bytes, 16u << 20);
  EXPECT_EQ(st->checkpoints, 0u);
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ExpectNothingLeft("killed");
  // The name is free again.
  auto w = MakeWriter("killed");
  AddPart(w.get(), 0, 1);
  EXPECT_TRUE(w->Commit().ok());
}

TEST_F(WriteTest, MultiPartWriteWithOneRankKilledFailsForEveryRank) {
  // Part 2 runs in a child that is killed while streaming; parts 0 and 1 must fail.
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t child = ::fork();
  if (child == 0) {
    ::close(ready[0]);
    WriterOptions o;
    o.part = 2;
    o.parts = 3;
    o.job = "job-dead";
    o.slot_bytes = 4096;
    auto w = Writer::Create(daemon_.socket(), "dead", o);
    if (!w.ok()) ::_exit(2);
    (void)(*w)->AddBox("w", DType::kF32, {kRows, kCols}, {42, 0}, {22, kCols},
                       [&](uint64_t, void*, uint64_t) {
                         (void)!::write(ready[1], "x", 1);
                         ::pause();
                         return Status::Ok();
                       });
    (void)(*w)->Commit();
    ::_exit(3);
  }
  ::close(ready[1]);
  auto w0 = MakeWriter("dead", 0, 3, "job-dead");
  auto w1 = MakeWriter("dead", 1, 3, "job-dead");
  auto r0 = std::make_shared<std::vector<float>>(WRows(0, 21));
  auto r1 = std::make_shared<std::vector<float>>(WRows(21, 21));
  ASSERT_TRUE(w0->AddBox("w", DType::kF32, {kRows, kCols}, {0, 0}, {21, kCols}, FromVector(r0)).ok());
  ASSERT_TRUE(w1->AddBox("w", DType::kF32, {kRows, kCols}, {21, 0}, {21, kCols}, FromVector(r1)).ok());
  auto f0 = std::async(std::launch::async, [&] { return w0->Commit(); });
  auto f1 = std::async(std::launch::async, [&] { return w1->Commit(); });
  char c;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);  // part 2 is streaming
  ::close(ready[0]);
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  auto a = f0.get(), b = f1.get();
  ASSERT_FALSE(a.ok());
  ASSERT_FALSE(b.ok());
  EXPECT_NE(a.status().message().find("part 2"), std::string::npos) << a.status().ToString();
  EXPECT_NE(b.status().message().find("part 2"), std::string::npos) << b.status().ToString();
  EXPECT_NE(a.status().message().find("nothing was published"), std::string::npos) << a.status().ToString();
  ExpectNothingLeft("dead");
}

TEST_F(WriteTest, MultiPartWriteWithARankThatNeverComesTimesOut) {
  std::vector<std::unique_ptr<Writer>> writers;
  std::vector<std::future<Result<LoadResult>>> futures;
  for (int64_t p = 0; p < 2; ++p) {
    WriterOptions o;
    o.part = p;
    o.parts = 3;
    o.job = "job-late";
    o.timeout_s = 1;
    auto w = Writer::Create(daemon_.socket(), "late", o);
    ASSERT_TRUE(w.ok());
    auto rows = std::make_shared<std::vector<float>>(WRows(p * 21, 21));
    ASSERT_TRUE((*w)->AddBox("w", DType::kF32, {kRows, kCols}, {p * 21, 0}, {21, kCols}, FromVector(rows)).ok());
    writers.push_back(std::move(w).value());
  }
  for (auto& w : writers) futures.push_back(std::async(std::launch::async, [&w] { return w->Commit(); }));
  for (auto& f : futures) {
    auto r = f.get();
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded) << r.status().ToString();
  }
  ExpectNothingLeft("late");
}

struct BadCase {
  const char* what;
  std::function<void(Writer*, int64_t)> add;
  const char* message;  // expected in every part's error
};

TEST_F(WriteTest, BadDeclarationsFailEveryPartAndLeaveNothing) {
  const std::vector<float> rows_a = WRows(0, 32), rows_b = WRows(32, 32);
  auto a = std::make_shared<std::vector<float>>(rows_a);
  auto b = std::make_shared<std::vector<float>>(rows_b);
  const std::vector<BadCase> cases = {
      {"missing rows",
       [&](Writer* w, int64_t p) {
         if (p == 0) {
           ASSERT_TRUE(w->AddBox("w", DType::kF32, {kRows, kCols}, {0, 0}, {32, kCols}, FromVector(a)).ok());
         }
       },
       "a hole"},
      {"overlap",
       [&](Writer* w, int64_t p) {
         ASSERT_TRUE(w->AddBox("w", DType::kF32, {kRows, kCols}, {p == 0 ? 0 : 31, 0}, {32, kCols},
                               FromVector(p == 0 ? a : b))
                         .ok());
       },
       "overlap"},
      {"dtype disagreement",
       [&](Writer* w, int64_t p) {
         ASSERT_TRUE(w->AddBox("w", p == 0 ? DType::kF32 : DType::kI32, {kRows, kCols}, {p * 32, 0}, {32, kCols},
                               FromVector(p == 0 ? a : b))
                         .ok());
       },
       "must agree"},
      {"shape disagreement",
       [&](Writer* w, int64_t p) {
         ASSERT_TRUE(w->AddBox("w", DType::kF32, {kRows, p == 0 ? kCols : kCols * 2}, {p * 32, 0}, {32, kCols},
                               FromVector(p == 0 ? a : b))
                         .ok());
       },
       "must agree"},
      {"flat and box mixed",
       [&](Writer* w, int64_t p) {
         if (p == 0) {
           ASSERT_TRUE(w->AddBox("w", DType::kF32, {kRows, kCols}, {0, 0}, {32, kCols}, FromVector(a)).ok());
         } else {
           ASSERT_TRUE(w->AddFlat("w", DType::kF32, {kRows, kCols}, 32 * kCols, 32 * kCols, FromVector(b)).ok());
         }
       },
       "written one way"},
      {"flat overlap",
       [&](Writer* w, int64_t p) {
         ASSERT_TRUE(w->AddFlat("w", DType::kF32, {kRows, kCols}, p == 0 ? 0 : 32 * kCols - 1, 32 * kCols,
                                FromVector(p == 0 ? a : b))
                         .ok());
       },
       "overlaps"},
  };
  int n = 0;
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string job = "job-bad-" + std::to_string(n++);
    auto results = CommitParts("bad", 2, job, c.add);
    for (auto& r : results) {
      ASSERT_FALSE(r.ok());
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
      EXPECT_NE(r.status().message().find(c.message), std::string::npos) << r.status().ToString();
    }
    ExpectNothingLeft("bad");
  }
  // The daemon still serves writes.
  auto results = CommitParts("bad", 2, "job-good", [&](Writer* w, int64_t p) { AddPart(w, p, 2); });
  for (auto& r : results) EXPECT_TRUE(r.ok()) << r.status().ToString();
}

TEST_F(WriteTest, ANameInUseNeedsReplace) {
  auto w = MakeWriter("used");
  AddPart(w.get(), 0, 1);
  auto first = w->Commit();
  ASSERT_TRUE(first.ok());
  auto again = MakeWriter("used");
  AddPart(again.get(), 0, 1);
  auto refused = again->Commit();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kAlreadyExists) << refused.status().ToString();
  WriterOptions o;
  o.replace = true;
  auto replace = Writer::Create(daemon_.socket(), "used", o);
  ASSERT_TRUE(replace.ok());
  AddPart(replace->get(), 0, 1);
  auto replaced = (*replace)->Commit();
  ASSERT_TRUE(replaced.ok()) << replaced.status().ToString();
  EXPECT_GT(replaced->checkpoint.generation, first->checkpoint.generation);
  EXPECT_EQ(ListSegments(daemon_.shm_prefix(), "used.").size(), 1u);  // the old one went (not attached)
}

TEST_F(WriteTest, DaemonKilledDuringAWriteAdoptsNothingAndAfterAPublishAdoptsIt) {
  // A published generation first.
  auto w = MakeWriter("kept");
  AddPart(w.get(), 0, 1);
  ASSERT_TRUE(w->Commit().ok());
  // Then a write that is mid-stream when the daemon is killed.
  std::atomic<bool> streaming{false};
  auto big = std::make_shared<std::vector<float>>(1 << 20, 2.0f);
  auto inflight = MakeWriter("inflight");
  ASSERT_TRUE(inflight
                  ->AddBox("big", DType::kF32, {1 << 20}, {}, {},
                           [&, big](uint64_t off, void* dst, uint64_t n) {
                             std::memcpy(dst, reinterpret_cast<const std::byte*>(big->data()) + off, n);
                             if (off >= 64 * 4096) {
                               streaming = true;
                               std::this_thread::sleep_for(std::chrono::milliseconds(20));
                             }
                             return Status::Ok();
                           })
                  .ok());
  auto f = std::async(std::launch::async, [&] { return inflight->Commit(); });
  ASSERT_TRUE(WaitFor([&] { return streaming.load(); }, 10000));
  EXPECT_EQ(ListSegments(daemon_.shm_prefix(), "inflight.").size(), 1u);
  daemon_.Kill();
  EXPECT_FALSE(f.get().ok());
  ASSERT_TRUE(daemon_.Start());
  auto client = Connect();
  auto list = client->List();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].name, "kept");
  EXPECT_TRUE(ListSegments(daemon_.shm_prefix(), "inflight.").empty());
  ExpectPattern("kept");
  auto verified = client->Verify("kept");
  ASSERT_TRUE(verified.ok());
  EXPECT_TRUE(verified->passed);
}

TEST_F(WriteTest, BudgetExceededFailsTheWriteAndLeavesNothing) {
  DaemonProcess small({"--memory-budget", "4M"});
  ASSERT_TRUE(small.Start());
  WriterOptions o;
  auto w = Writer::Create(small.socket(), "huge", o);
  ASSERT_TRUE(w.ok());
  auto big = std::make_shared<std::vector<float>>(2 << 20, 1.0f);  // 8 MiB
  ASSERT_TRUE((*w)->AddBox("big", DType::kF32, {2 << 20}, {}, {}, FromVector(big)).ok());
  auto r = (*w)->Commit();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();
  EXPECT_TRUE(ListSegments(small.shm_prefix()).empty());
}

TEST_F(WriteTest, TheCApiPublishesInTwoPartsAndReadsBack) {
  const std::vector<float> top = WRows(0, 32), bottom = WRows(32, 32);
  const int64_t global[2] = {kRows, kCols};
  std::vector<ckpt_writer*> writers(2, nullptr);
  for (int p = 0; p < 2; ++p) {
    ckpt_writer_options o{"job-c", p, 2, 0, 30};
    ASSERT_EQ(ckpt_writer_create(daemon_.socket().c_str(), "from-c", &o, &writers[p]), 0) << ckpt_last_error();
    const int64_t offsets[2] = {p * 32, 0}, shape[2] = {32, kCols};
    ASSERT_EQ(ckpt_writer_add(writers[p], "w", static_cast<uint32_t>(DType::kF32), 2, global, offsets, shape,
                              p == 0 ? top.data() : bottom.data()),
              0)
        << ckpt_last_error();
  }
  ASSERT_EQ(ckpt_writer_side_file(writers[0], "note.txt", "hi", 2), 0);
  uint64_t generations[2] = {0, 0};
  int rcs[2] = {-1, -1};
  std::thread other([&] { rcs[1] = ckpt_writer_commit(writers[1], &generations[1]); });
  rcs[0] = ckpt_writer_commit(writers[0], &generations[0]);
  other.join();
  EXPECT_EQ(rcs[0], 0);
  EXPECT_EQ(rcs[1], 0);
  EXPECT_EQ(generations[0], generations[1]);
  for (ckpt_writer* w : writers) ckpt_writer_free(w);
  ckpt_client* client = nullptr;
  ASSERT_EQ(ckpt_connect(daemon_.socket().c_str(), &client), 0);
  ckpt_checkpoint* c = nullptr;
  ASSERT_EQ(ckpt_attach(client, "from-c", &c), 0) << ckpt_last_error();
  ckpt_tensor t;
  ASSERT_EQ(ckpt_tensor_find(c, "w", &t), 0);
  EXPECT_EQ(std::memcmp(t.data, top.data(), top.size() * 4), 0);
  EXPECT_EQ(std::memcmp(static_cast<const char*>(t.data) + top.size() * 4, bottom.data(), bottom.size() * 4), 0);
  const void* side = nullptr;
  uint64_t side_size = 0;
  ASSERT_EQ(ckpt_side_file(c, "note.txt", &side, &side_size), 0);
  EXPECT_EQ(std::string(static_cast<const char*>(side), side_size), "hi");
  ckpt_detach(c);
  // A writer freed without committing publishes nothing; bad arguments are errors.
  ckpt_writer* dropped = nullptr;
  ASSERT_EQ(ckpt_writer_create(daemon_.socket().c_str(), "dropped", nullptr, &dropped), 0);
  EXPECT_NE(ckpt_writer_add(dropped, "w", 999, 2, global, nullptr, nullptr, top.data()), 0);
  EXPECT_NE(ckpt_writer_add(dropped, "w", static_cast<uint32_t>(DType::kF32), 2, nullptr, nullptr, nullptr, top.data()), 0);
  ckpt_writer_free(dropped);
  ckpt_client_free(client);
  ExpectNothingLeft("dropped");
}

// ---- a writer speaking the protocol itself ----

// A write over a raw connection with a ring this test keeps (and may abuse).
class RawWrite {
 public:
  RawWrite(const std::string& socket, uint64_t ring_bytes, bool seal) : bytes_(ring_bytes) {
    ring_.reset(::memfd_create("test-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    EXPECT_TRUE(ring_.valid());
    EXPECT_EQ(::ftruncate(ring_.get(), static_cast<off_t>(ring_bytes)), 0);
    if (seal) {
      EXPECT_EQ(::fcntl(ring_.get(), F_ADD_SEALS, F_SEAL_SHRINK), 0);
    }
    map_ = static_cast<std::byte*>(::mmap(nullptr, ring_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, ring_.get(), 0));
    auto fd = protocol::ConnectUnix(socket);
    EXPECT_TRUE(fd.ok());
    sock_ = std::move(fd).value();
  }
  ~RawWrite() { ::munmap(map_, bytes_); }

  Status Request(const std::string& name, const std::vector<protocol::WritePiece>& pieces) {
    protocol::WriteRequest r;
    r.name = name;
    r.ring_bytes = bytes_;
    r.pieces = pieces;
    json j = protocol::Encode(r);
    j["v"] = protocol::kProtocolVersion;
    j["op"] = "write";
    return protocol::WriteFrameWithFd(sock_.get(), j, ring_.get());
  }
  Status Send(const std::string& op, json j) {
    j["v"] = protocol::kProtocolVersion;
    j["op"] = op;
    return protocol::WriteFrame(sock_.get(), j);
  }
  Result<json> Read() { return protocol::ReadFrame(sock_.get(), protocol::kMaxResponseBytes, nullptr, protocol::DeadlineIn(20)); }
  std::byte* ring() { return map_; }
  int ring_fd() { return ring_.get(); }

 private:
  UniqueFd ring_, sock_;
  std::byte* map_ = nullptr;
  uint64_t bytes_;
};

protocol::WritePiece WholeF32(const std::string& key, int64_t n) {
  protocol::WritePiece p;
  p.key = key;
  p.dtype = DType::kF32;
  p.global_shape = {n};
  p.offsets = {0};
  p.shape = {n};
  return p;
}

json Chunk(uint64_t slot, uint64_t piece, uint64_t offset, uint64_t ring_offset, uint64_t bytes) {
  protocol::WriteChunkRequest c;
  c.slot = slot;
  c.items.push_back({piece, offset, ring_offset, bytes});
  return protocol::Encode(c);
}

TEST_F(WriteTest, APublishedGenerationCannotBeChangedByItsWriter) {
  RawWrite raw(daemon_.socket(), 8192, true);
  ASSERT_TRUE(raw.Request("sealed", {WholeF32("t", 1024)}).ok());
  auto ready = raw.Read();
  ASSERT_TRUE(ready.ok());
  ASSERT_EQ(protocol::EventName(*ready), protocol::kWriteReadyEvent) << ready->dump();
  std::vector<float> values(1024);
  for (int i = 0; i < 1024; ++i) values[i] = static_cast<float>(i);
  std::memcpy(raw.ring(), values.data(), 4096);
  ASSERT_TRUE(raw.Send("write_chunk", Chunk(0, 0, 0, 0, 4096)).ok());
  auto ack = raw.Read();
  ASSERT_TRUE(ack.ok());
  EXPECT_EQ(protocol::EventName(*ack), protocol::kWriteAckEvent);
  ASSERT_TRUE(raw.Send("write_seal", json::object()).ok());
  auto published = raw.Read();
  ASSERT_TRUE(published.ok());
  ASSERT_TRUE(protocol::StatusOf(*published).ok()) << published->dump();

  // The writer now tries everything it holds: write through its ring's mapping and fd,
  // shrink the ring, send the chunk again on the same connection.
  std::memset(raw.ring(), 0xff, 8192);
  EXPECT_EQ(::pwrite(raw.ring_fd(), "garbage!", 8, 0), 8);
  EXPECT_EQ(::ftruncate(raw.ring_fd(), 0), -1);  // sealed against shrinking
  EXPECT_EQ(errno, EPERM);
  ASSERT_TRUE(raw.Send("write_chunk", Chunk(0, 0, 0, 0, 4096)).ok());
  auto again = raw.Read();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(protocol::StatusOf(*again).code(), StatusCode::kFailedPrecondition) << again->dump();
  ASSERT_TRUE(raw.Send("write_seal", json::object()).ok());
  auto reseal = raw.Read();
  ASSERT_TRUE(reseal.ok());
  EXPECT_FALSE(protocol::StatusOf(*reseal).ok());

  // The generation is unchanged, and its only descriptor a client gets is read-only.
  auto ckpt = Connect()->Attach("sealed");
  ASSERT_TRUE(ckpt.ok());
  auto t = (*ckpt)->Tensor("t");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(std::memcmp(t->data, values.data(), 4096), 0);
  EXPECT_TRUE((*ckpt)->Verify().ok());
  auto verified = Connect()->Verify("sealed");
  ASSERT_TRUE(verified.ok());
  EXPECT_TRUE(verified->passed);
}

TEST_F(WriteTest, ARingThatCanShrinkIsRefused) {
  RawWrite raw(daemon_.socket(), 8192, /*seal=*/false);
  ASSERT_TRUE(raw.Request("unsealed", {WholeF32("t", 1024)}).ok());
  auto r = raw.Read();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(protocol::StatusOf(*r).code(), StatusCode::kInvalidArgument) << r->dump();
  EXPECT_NE(r->dump().find("F_SEAL_SHRINK"), std::string::npos);
  ExpectNothingLeft("unsealed");
}

TEST_F(WriteTest, BytesBeyondTheDeclaredSizeFailTheWrite) {
  struct Abuse {
    const char* what;
    json chunk;
  };
  const std::vector<Abuse> abuses = {
      {"past the piece", Chunk(0, 0, 0, 0, 4100)},
      {"out of order", Chunk(0, 0, 4, 0, 8)},
      {"unknown piece", Chunk(0, 7, 0, 0, 8)},
      {"outside the ring", Chunk(0, 0, 0, 8000, 400)},
      {"offset overflow", Chunk(0, 0, ~0ull - 2, 0, 8)},
  };
  for (const Abuse& a : abuses) {
    SCOPED_TRACE(a.what);
    RawWrite raw(daemon_.socket(), 8192, true);
    ASSERT_TRUE(raw.Request("beyond", {WholeF32("t", 1024)}).ok());
    auto ready = raw.Read();
    ASSERT_TRUE(ready.ok());
    ASSERT_EQ(protocol::EventName(*ready), protocol::kWriteReadyEvent);
    ASSERT_TRUE(raw.Send("write_chunk", a.chunk).ok());
    auto r = raw.Read();
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(protocol::StatusOf(*r).code(), StatusCode::kInvalidArgument) << r->dump();
    ExpectNothingLeft("beyond");
  }
  // Sealing before every byte arrived fails too.
  RawWrite raw(daemon_.socket(), 8192, true);
  ASSERT_TRUE(raw.Request("short", {WholeF32("t", 1024)}).ok());
  ASSERT_TRUE(raw.Read().ok());
  ASSERT_TRUE(raw.Send("write_chunk", Chunk(0, 0, 0, 0, 4092)).ok());
  ASSERT_TRUE(raw.Read().ok());
  ASSERT_TRUE(raw.Send("write_seal", json::object()).ok());
  auto r = raw.Read();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(protocol::StatusOf(*r).code(), StatusCode::kInvalidArgument) << r->dump();
  EXPECT_NE(r->dump().find("4092 of its 4096"), std::string::npos) << r->dump();
  ExpectNothingLeft("short");
}

// ---- roles ----

// Runs a one-tensor write as `user` in a child process; returns its status code.
int WriteAs(const TempUser& user, const std::string& socket, const std::string& name) {
  passwd* pw = ::getpwnam(user.name().c_str());
  if (pw == nullptr) return -1;
  const uid_t uid = pw->pw_uid;
  const gid_t gid = pw->pw_gid;
  pid_t child = ::fork();
  if (child == 0) {
    if (::initgroups(user.name().c_str(), gid) != 0 || ::setgid(gid) != 0 || ::setuid(uid) != 0) ::_exit(100);
    auto w = Writer::Create(socket, name, WriterOptions{});
    if (!w.ok()) ::_exit(101);
    auto data = std::make_shared<std::vector<float>>(256, 1.0f);
    if (!(*w)->AddBox("t", DType::kF32, {256}, {}, {}, FromVector(data)).ok()) ::_exit(102);
    auto r = (*w)->Commit();
    ::_exit(r.ok() ? 0 : static_cast<int>(r.status().code()));
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -2;
}

TEST(WriteRoleTest, OnlyTheWriterGroupAndAdminsMayWrite) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to create users";
  TempGroup writers, readers;
  TempUser writer({writers.name(), readers.name()});
  TempUser reader({readers.name()});
  DaemonProcess daemon({"--writer-group", writers.name(), "--reader-group", readers.name(), "--socket-mode", "0666"});
  ASSERT_TRUE(daemon.Start());
  const std::string dir = daemon.socket().substr(0, daemon.socket().rfind('/'));
  ASSERT_EQ(::chmod(dir.c_str(), 0755), 0);
  EXPECT_EQ(WriteAs(reader, daemon.socket(), "by-reader"), static_cast<int>(StatusCode::kPermissionDenied));
  EXPECT_EQ(WriteAs(writer, daemon.socket(), "by-writer"), 0);
  auto client = Client::Connect(daemon.socket());
  ASSERT_TRUE(client.ok());
  auto list = (*client)->List();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].name, "by-writer");
  EXPECT_TRUE(ListSegments(daemon.shm_prefix(), "by-reader.").empty());
  // Without a writer group only admins write.
  DaemonProcess no_group({"--socket-mode", "0666"});
  ASSERT_TRUE(no_group.Start());
  ASSERT_EQ(::chmod(no_group.socket().substr(0, no_group.socket().rfind('/')).c_str(), 0755), 0);
  EXPECT_EQ(WriteAs(writer, no_group.socket(), "no-group"), static_cast<int>(StatusCode::kPermissionDenied));
}

}  // namespace
}  // namespace ckpt
