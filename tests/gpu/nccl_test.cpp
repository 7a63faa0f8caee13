// The NCCL communicator in one process (a group of one: every collective runs through NCCL and
// leaves the data as it was). Several ranks need several GPUs; a one-GPU machine checks the
// set-up, the stream ordering, the handles, the stats and split.
#include "comm/nccl_communicator.h"
#include "gpu_test_util.h"

namespace fab::test {
namespace {

TEST(Nccl, GroupOfOneRunsEveryCollective) {
  auto comm = NcclCommunicator::create(nccl_unique_id(), 0, 1, 60.0);
  ASSERT_EQ(comm->size(), 1);
  const int64_t n = 1001;
  Tensor x = random_tensor({n}, 80), d = to_device(x);
  comm->all_reduce(d.data<float>(), n, "grads").wait();
  expect_device_close(d, x, 0, "all_reduce of one rank");
  comm->reduce_scatter(d.data<float>(), n, "grads").wait();
  comm->all_gather(d.data<float>(), n, "params").wait();
  comm->broadcast(d.raw(), int64_t(d.bytes()), 0, "weights").wait();
  expect_device_close(d, x, 0, "reduce_scatter, all_gather, broadcast of one rank");
  Tensor yd = host_tensor({4}, DType::f32);
  for (int i = 0; i < 4; ++i) yd.data<float>()[i] = 0.5;
  Tensor dd = to_device(yd);
  comm->barrier("test");
  EXPECT_EQ(comm->stats().collectives, 5);  // the barrier is an all-reduce
  auto sub = comm->split(0, 0);
  EXPECT_EQ(sub->size(), 1);
  sub->all_reduce(dd.data<float>(), 4, "sub").wait();
  expect_device_close(dd, yd, 0, "all_reduce on a split communicator");
}

}  // namespace
}  // namespace fab::test
