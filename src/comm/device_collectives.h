#pragma once
// The collectives of a group over a device's memory: NCCL for CUDA (in builds with the CUDA
// backend). The host group bootstraps it (its rank 0 makes NCCL's id and broadcasts it).
#include <memory>

#include "comm/communicator.h"
#include "core/device.h"

namespace fab {

// nullptr for the host (its groups take host memory); throws UserError for a device this build
// has no collectives for.
std::unique_ptr<Communicator> device_collectives(Communicator& host_group, Device device, double timeout_seconds);

}  // namespace fab
