// The one place that calls LibTorch's c10d library (TCPStore, Gloo, NCCL).
//
// c10d's classes moved between LibTorch 1.13 and 2.x (the Gloo and NCCL
// process groups derive from c10d::ProcessGroup in 1.13 and from
// c10d::Backend in 2.x; device factories grew a lazy-init flag; the store
// grew a libuv server), so everything that names a c10d type lives in
// c10d_compat.cc behind `#if TORCH_VERSION_MAJOR`. This header names none,
// and DistContext (process_group.h) builds on it.
//
// Every function here may throw the exceptions LibTorch and Gloo throw
// (c10::Error, std::exception); the caller converts them into a Status.
#ifndef LORAPLEX_CORE_DIST_C10D_COMPAT_H_
#define LORAPLEX_CORE_DIST_C10D_COMPAT_H_

#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace loraplex {

// A key-value store that every rank reaches: a c10d::TCPStore whose server
// runs inside rank 0.
class C10dStore {
 public:
  // Hosts the store at host:port (`is_host`) or connects to it, retrying
  // until `timeout`. Returns without waiting for the other ranks.
  C10dStore(const std::string& host, int port, bool is_host, int world_size,
            std::chrono::milliseconds timeout);
  ~C10dStore();
  C10dStore(const C10dStore&) = delete;
  C10dStore& operator=(const C10dStore&) = delete;

  // Adds `delta` to the counter `key` and returns its new value.
  int64_t Add(const std::string& key, int64_t delta);

 private:
  friend class C10dCollectives;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Where Gloo's TCP transport binds. Exactly one way is used: `hostname`
// (an address of this host, e.g. a loopback MASTER_ADDR) when set, else
// `interface` when set, else the host's default address.
struct GlooTransport {
  std::string hostname;
  std::string interface;
};

// A c10d process group (Gloo or NCCL) over a C10dStore. Collectives are
// blocking and in place; every rank must call the same ones in the same
// order with tensors of the same sizes and dtypes.
class C10dCollectives {
 public:
  // Gloo over CPU tensors. `timeout` bounds the connection to the peers and
  // every later collective.
  static std::unique_ptr<C10dCollectives> CreateGloo(
      C10dStore& store, int rank, int world_size,
      std::chrono::milliseconds timeout, const GlooTransport& transport);

  // True when this build has NCCL (CMake option LORAPLEX_WITH_NCCL).
  static bool NcclAvailable();
  // NCCL over CUDA tensors on `device`; throws when !NcclAvailable().
  static std::unique_ptr<C10dCollectives> CreateNccl(
      C10dStore& store, int rank, int world_size,
      std::chrono::milliseconds timeout, torch::Device device);

  ~C10dCollectives();
  C10dCollectives(const C10dCollectives&) = delete;
  C10dCollectives& operator=(const C10dCollectives&) = delete;

  // Sums `tensor` over the ranks, in place.
  void AllReduceSum(torch::Tensor& tensor);
  // Replaces `tensor` on every rank by root's.
  void Broadcast(torch::Tensor& tensor, int root);
  // Fills `full` (contiguous, world_size times `shard`'s elements) with every
  // rank's `shard` in rank order.
  void AllGather(const torch::Tensor& shard, torch::Tensor& full);
  // Starts the same all-gather and returns at once; calling the result
  // waits until `full` is filled (on CUDA: until the current stream waits
  // for it). Call it exactly once, before the next collective is waited on.
  std::function<void()> StartAllGather(const torch::Tensor& shard,
                                       torch::Tensor& full);
  // Returns once every rank has entered.
  void Barrier();

 private:
  struct Impl;
  explicit C10dCollectives(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace loraplex

#endif  // LORAPLEX_CORE_DIST_C10D_COMPAT_H_
