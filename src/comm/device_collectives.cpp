#include "comm/device_collectives.h"

#include "core/error.h"
#if FAB_HAVE_CUDA
#include "comm/nccl_communicator.h"
#endif

namespace fab {

std::unique_ptr<Communicator> device_collectives(Communicator& host_group, Device device, double timeout_seconds) {
  if (device.is_host()) return nullptr;
#if FAB_HAVE_CUDA
  if (device.kind == DeviceKind::cuda) return NcclCommunicator::from(host_group, timeout_seconds);
#endif
  (void)host_group, (void)timeout_seconds;
  throw UserError(format("data parallel on device {} needs its collectives (NCCL for cuda), which this build lacks",
                         device.str()));
}

}  // namespace fab
