#pragma once
// The guard device: a test-only backend whose memory the host may not touch. Its memory is one
// reserved address range kept PROT_NONE, opened (read/write) only while one of the backend's own
// operations runs: a kernel of its table (the CPU kernels, wrapped), a copy or a fill. Any other
// host read or write of device memory -- a forgotten copy in the model, trainer, optimizer,
// checkpoint or communication -- is a segmentation fault in the test that made it. So the code
// path a GPU takes is checked for host accesses on a machine without one, and because the
// kernels are the CPU's, a run on it must equal the CPU run bit for bit.
#include <cstddef>
#include <memory>

#include "comm/communicator.h"
#include "core/device.h"

namespace fab::test {

// Installs the guard backend (the first call) and returns its device.
Device guard_device();
// Bytes of guard memory in use.
size_t guard_live_bytes();
// Collectives over guard memory: each buffer is copied to the host, reduced by `host` (an MPI
// group, say), and copied back -- what a device without a collective library of its own would do.
std::unique_ptr<Communicator> guard_collectives(Communicator& host);

}  // namespace fab::test
