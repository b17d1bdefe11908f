#pragma once
// The Backend on one GPU: a compute stream and a communication stream
// (non-blocking, so they overlap), CUDA events for their ordering and for
// timing, device allocations, and an NCCL communicator whose point-to-point
// groups run on the communication stream.
#include <memory>

#include "host/backend/backend.hpp"
#include "host/backend/host_backend.hpp"
#include "host/bootstrap/bootstrap.hpp"

namespace cpsched::gpu {

// Number of visible CUDA devices; 0 when there is none or the driver is
// missing (never throws).
int cuda_device_count();

// Picks the device (local rank modulo the visible devices), creates the
// streams and, when the world has more than one rank, the NCCL communicator
// (rank 0's unique id travels through the bootstrap). Throws cpsched::Error.
std::unique_ptr<Backend> make_cuda_backend(Bootstrap& bootstrap);

// Test double: a backend on `device` whose point-to-point groups go through a
// HostWorld (device -> host -> device copies after the comm stream drained)
// instead of NCCL, so several ranks can share one GPU as threads of one
// process. Kernels, streams and events are the real ones.
std::unique_ptr<Backend> make_cuda_loopback_backend(HostWorld& world, Rank rank, int device);

}  // namespace cpsched::gpu
