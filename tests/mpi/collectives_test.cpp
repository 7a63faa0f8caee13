// The ring collectives of MpiCommunicator: exact sums, every chunk layout (n smaller than, equal
// to and larger than the group), bytes sent as the ring algorithm says, overlapping handles,
// point to point, broadcast, sub-groups, and all_to_all with counts (MPI and the one-process group).
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "mpi/mpi_world.h"
#include "parallel/mesh.h"

namespace fab {
namespace {

// Small integers: every partial sum is exact in fp32, so the result must be exact.
float value(int rank, int64_t i) { return float((rank + 1) * 3 + i % 17); }

TEST(Collectives, AllReduceSumsExactlyForEverySize) {
  Communicator& w = test::world();
  const int n_ranks = w.size();
  for (int64_t n : {int64_t(0), int64_t(1), int64_t(n_ranks - 1), int64_t(n_ranks), int64_t(1000), int64_t(100003)}) {
    std::vector<float> data(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) data[size_t(i)] = value(w.rank(), i);
    w.all_reduce(data.data(), n, "test all_reduce").wait();
    for (int64_t i = 0; i < n; ++i) {
      float expected = 0;
      for (int r = 0; r < n_ranks; ++r) expected += value(r, i);
      ASSERT_EQ(data[size_t(i)], expected) << "n " << n << " element " << i;
    }
  }
}

TEST(Collectives, ReduceScatterThenAllGatherEqualsAllReduce) {
  Communicator& w = test::world();
  const int64_t n = 12345;
  std::vector<float> data(n);
  for (int64_t i = 0; i < n; ++i) data[size_t(i)] = value(w.rank(), i);
  w.reduce_scatter(data.data(), n, "test reduce_scatter").wait();
  const auto [first, last] = chunk_range(n, w.size(), w.rank());
  for (int64_t i = first; i < last; ++i) {
    float expected = 0;
    for (int r = 0; r < w.size(); ++r) expected += value(r, i);
    ASSERT_EQ(data[size_t(i)], expected) << i;
  }
  w.all_gather(data.data(), n, "test all_gather").wait();
  for (int64_t i = 0; i < n; ++i) {
    float expected = 0;
    for (int r = 0; r < w.size(); ++r) expected += value(r, i);
    ASSERT_EQ(data[size_t(i)], expected) << i;
  }
}

// A ring all-reduce sends 2 (N - 1) / N of the buffer from every rank.
TEST(Collectives, BytesSentAreTheRingFigure) {
  Communicator& w = test::world();
  const int64_t n = 1 << 20;
  std::vector<float> data(n, 1.0f);
  const CommStats before = w.stats();
  w.all_reduce(data.data(), n, "test bytes").wait();
  const double sent = double(w.stats().bytes_sent - before.bytes_sent);
  const double ring = 2.0 * (w.size() - 1) / w.size() * double(n) * sizeof(float);
  EXPECT_NEAR(sent / ring, 1.0, 1e-3);
  EXPECT_EQ(w.stats().collectives, before.collectives + 1);
}

TEST(Collectives, HandlesOverlapAndCompleteInAnyWaitOrder) {
  Communicator& w = test::world();
  std::vector<std::vector<double>> buffers(5, std::vector<double>(777, double(w.rank())));
  std::vector<CommHandle> handles;
  for (auto& b : buffers) handles.push_back(w.all_reduce(b.data(), int64_t(b.size()), "test overlap"));
  for (size_t i = handles.size(); i-- > 0;) handles[i].wait();
  const double expected = double(w.size()) * (w.size() - 1) / 2;
  for (auto& b : buffers) EXPECT_EQ(b[776], expected);
}

TEST(Collectives, PointToPointAndBroadcast) {
  Communicator& w = test::world();
  const int right = (w.rank() + 1) % w.size(), left = (w.rank() + w.size() - 1) % w.size();
  int64_t mine = 1000 + w.rank(), received = -1;
  if (w.rank() % 2 == 0) {
    w.send(&mine, sizeof mine, right);
    w.recv(&received, sizeof received, left);
  } else {
    w.recv(&received, sizeof received, left);
    w.send(&mine, sizeof mine, right);
  }
  EXPECT_EQ(received, 1000 + left);
  char text[16] = {};
  if (w.rank() == w.size() - 1) std::snprintf(text, sizeof text, "from %d", w.rank());
  w.broadcast(text, sizeof text, w.size() - 1, "test broadcast").wait();
  EXPECT_EQ(std::string(text), "from " + std::to_string(w.size() - 1));
  w.barrier("test barrier");
}

// The mesh's groups are real sub-communicators: a dp all-reduce sums over the dp group only.
TEST(Collectives, MeshGroupsReduceWithinThemselves) {
  Communicator& w = test::world();
  if (w.size() % 2) GTEST_SKIP() << "needs an even world";
  const ParallelSizes sizes{.tp = 2, .cp = 1, .dp = w.size() / 2, .pp = 1};
  DeviceMesh mesh(w, sizes, "tp-cp-dp-pp");
  double r = w.rank();
  mesh.group("dp").all_reduce(&r, 1, "test dp").wait();
  double expected = 0;
  const auto dp_groups = mesh_groups(w.size(), sizes, "tp-cp-dp-pp", "dp");
  for (int q : dp_groups[size_t(w.rank() % 2)]) expected += q;
  EXPECT_EQ(r, expected);
  EXPECT_EQ(mesh.group("tp").size(), 2);
  EXPECT_EQ(mesh.group("tp").rank(), w.rank() % 2);
  EXPECT_EQ(mesh.coordinate("tp"), w.rank() % 2);
  EXPECT_EQ(mesh.coordinate("dp"), w.rank() / 2);
}

}  // namespace
}  // namespace fab

namespace fab {
namespace {

// Rank a sends rank b count(a, b) elements (0 for some pairs), each naming a, b and its index.
int64_t a2a_count(int a, int b) { return (a + 2 * b) % 3; }
float a2a_value(int a, int b, int64_t i) { return float(a * 1000 + b * 10 + i); }

TEST(Collectives, AllToAllWithCountsDeliversEveryBlock) {
  Communicator& w = test::world();
  const int n = w.size(), me = w.rank();
  std::vector<int64_t> send_counts(n), recv_counts(n);
  std::vector<float> send;
  for (int b = 0; b < n; ++b) {
    send_counts[size_t(b)] = a2a_count(me, b);
    recv_counts[size_t(b)] = a2a_count(b, me);
    for (int64_t i = 0; i < send_counts[size_t(b)]; ++i) send.push_back(a2a_value(me, b, i));
  }
  std::vector<float> recv(size_t(std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t(0))), -1.0f);
  const CommStats before = w.stats();
  w.all_to_all(send.data(), send_counts.data(), recv.data(), recv_counts.data(), "test all_to_all").wait();
  size_t at = 0;
  for (int a = 0; a < n; ++a)
    for (int64_t i = 0; i < recv_counts[size_t(a)]; ++i) ASSERT_EQ(recv[at++], a2a_value(a, me, i)) << a << " " << i;
  int64_t to_others = 0;
  for (int b = 0; b < n; ++b) to_others += b == me ? 0 : send_counts[size_t(b)];
  EXPECT_EQ(w.stats().bytes_sent - before.bytes_sent, to_others * int64_t(sizeof(float)));
}

TEST(Collectives, AllToAllOfOneProcessCopiesItsOwnBlock) {
  LocalCommunicator one;
  const std::vector<float> send = {1, 2, 3};
  std::vector<float> recv(3, 0.0f);
  const int64_t count = 3;
  one.all_to_all(send.data(), &count, recv.data(), &count, "local all_to_all").wait();
  EXPECT_EQ(recv, send);
}

}  // namespace
}  // namespace fab
