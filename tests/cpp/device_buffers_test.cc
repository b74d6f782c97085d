// The EP's device-memory registry (engine/device_buffers.h) without ORT: allocations, in-place
// inputs, zero-copy outputs, and the engine using a registered buffer without copying it.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

#include "engine/device_buffers.h"
#include "engine/program.h"
#include "graph_builders.h"

using namespace ortmlx;
namespace mx = mlx::core;
namespace db = engine::device_buffers;

TEST(DeviceBuffers, AllocateOwnsRelease) {
  const size_t before = db::count();
  void* p = db::allocate(64);
  ASSERT_NE(p, nullptr);
  size_t n = 0;
  EXPECT_TRUE(db::owns(p, &n));
  EXPECT_EQ(n, 64u);
  EXPECT_FALSE(db::owns(static_cast<char*>(p) + 4));  // only buffer starts are registered
  std::memset(p, 0x5a, 64);                            // host-addressable
  EXPECT_EQ(db::count(), before + 1);
  EXPECT_TRUE(db::release(p));
  EXPECT_FALSE(db::release(p));
  EXPECT_EQ(db::count(), before);
  void* z = db::allocate(0);  // ORT may ask for 0 bytes: a valid, distinct pointer
  EXPECT_NE(z, nullptr);
  EXPECT_TRUE(db::release(z));
}

TEST(DeviceBuffers, BorrowIsInPlace) {
  auto* p = static_cast<float*>(db::allocate(6 * sizeof(float)));
  for (int i = 0; i < 6; ++i) p[i] = static_cast<float>(i);
  auto a = db::borrow(p, {2, 3}, mx::float32);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->data<float>(), p);  // the same memory, no copy
  EXPECT_FALSE(a->is_donatable());  // MLX never writes into it
  auto s = mx::sum(*a);
  s.eval();
  EXPECT_EQ(s.item<float>(), 15.0f);
  EXPECT_FALSE(db::borrow(p, {4, 3}, mx::float32).has_value());  // larger than the buffer
  EXPECT_FALSE(db::borrow(p + 1, {1}, mx::float32).has_value());  // not a buffer start
  a.reset();
  EXPECT_TRUE(db::release(p));
}

TEST(DeviceBuffers, AdoptOnlyExclusiveResults) {
  auto r = mx::exp(mx::arange(8, mx::float32));
  r.eval();
  ASSERT_TRUE(db::adoptable(r));
  auto copy = r;  // a second holder: not exclusive
  EXPECT_FALSE(db::adoptable(r));
  copy = mx::array(0.0f);
  ASSERT_TRUE(db::adoptable(r));
  auto view = mx::slice(r, {2}, {6});
  view.eval();
  EXPECT_FALSE(db::adoptable(view));  // shares r's buffer, and not at its start

  const void* data = r.data<void>();
  {
    db::Armed armed(r);
    void* other = db::allocate(r.nbytes() + 4);  // another size: a fresh buffer
    EXPECT_NE(other, data);
    void* p = db::allocate(r.nbytes());  // same size: r's buffer, no copy
    EXPECT_EQ(p, data);
    EXPECT_EQ(armed.taken(), data);
    void* q = db::allocate(r.nbytes());  // taken once only
    EXPECT_NE(q, data);
    db::release(other);
    db::release(q);
  }
  auto expected = mx::exp(mx::arange(8, mx::float32));
  expected.eval();
  r = mx::array(0.0f);  // the registry now keeps the buffer alive
  EXPECT_EQ(std::memcmp(data, expected.data<void>(), expected.nbytes()), 0);
  EXPECT_TRUE(db::release(const_cast<void*>(data)));
}

TEST(DeviceBuffers, DisarmedWhenNothingTakesIt) {
  auto r = mx::ones({4}, mx::float32);
  r.eval();
  {
    db::Armed armed(r);
  }
  void* p = db::allocate(r.nbytes());
  EXPECT_NE(p, r.data<void>());
  db::release(p);
}

TEST(DeviceBuffers, ThreadSafe) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([] {
      for (int i = 0; i < 200; ++i) {
        void* p = db::allocate(static_cast<size_t>(16 + i));
        ASSERT_TRUE(db::owns(p));
        ASSERT_TRUE(db::release(p));
      }
    });
  for (auto& th : threads) th.join();
}

TEST(DeviceBuffers, EngineUsesRegisteredInputInPlace) {
  graph::Graph g;
  g.nodes.push_back(test::node("Neg", {"x"}, {"y"}, 13));
  graph::ValueInfo y;
  y.name = "y";
  y.dtype = graph::DType::Float32;
  g.values["y"] = y;
  engine::Options opt;
  opt.compile_after = 1;
  opt.device_memory = true;  // as the EP sets it when the library registered device memory
  engine::Program prog("neg", g, {"x"}, {"y"}, opt);
  auto* p = static_cast<float*>(db::allocate(4 * sizeof(float)));
  for (int i = 0; i < 4; ++i) p[i] = static_cast<float>(i + 1);
  engine::HostTensor x;
  x.dtype = graph::DType::Float32;
  x.shape = {4};
  x.data = p;
  const auto borrowed = db::counters().inputs_borrowed.load();
  for (int run = 0; run < 2; ++run) {  // eager probe, then compiled
    auto out = prog.run({x});
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].data<float>()[3], -4.0f);
  }
  EXPECT_EQ(db::counters().inputs_borrowed.load(), borrowed + 2);
  EXPECT_TRUE(db::release(p));
}
