#pragma once
// The communicator of every process of the MPI test run.
#include "comm/communicator.h"

namespace fab::test {
Communicator& world();
}  // namespace fab::test
