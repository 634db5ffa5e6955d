#include "core/dist/c10d_compat.h"

#include <torch/version.h>

#include <utility>
#include <vector>

// c10d's Gloo and NCCL headers are empty unless the includer opts in; the
// libtorch_cpu we link was built with Gloo.
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO 1
#endif
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#ifdef LORAPLEX_WITH_NCCL
#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL 1
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace loraplex {
namespace {

// What ProcessGroupGloo / ProcessGroupNCCL derive from.
#if TORCH_VERSION_MAJOR >= 2
using CollectiveBackend = c10d::Backend;
#else
using CollectiveBackend = c10d::ProcessGroup;
#endif

std::shared_ptr<::gloo::transport::Device> MakeGlooDevice(
    const GlooTransport& transport) {
  // 2.x adds a defaulted `lazyInit` argument to each factory; the calls
  // read the same in both.
  if (!transport.hostname.empty()) {
    return c10d::ProcessGroupGloo::createDeviceForHostname(transport.hostname);
  }
  if (!transport.interface.empty()) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(
        transport.interface);
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

}  // namespace

struct C10dStore::Impl {
  c10::intrusive_ptr<c10d::Store> store;
};

C10dStore::C10dStore(const std::string& host, int port, bool is_host,
                     int world_size, std::chrono::milliseconds timeout)
    : impl_(std::make_unique<Impl>()) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(port);
  options.isServer = is_host;
  options.numWorkers = static_cast<std::size_t>(world_size);
  // The ranks' arrival is counted by the caller, which can then say how
  // many came; the store's own wait only says that it timed out.
  options.waitWorkers = false;
  options.timeout = timeout;
  impl_->store = c10::make_intrusive<c10d::TCPStore>(host, options);
}

C10dStore::~C10dStore() = default;

int64_t C10dStore::Add(const std::string& key, int64_t delta) {
  return impl_->store->add(key, delta);
}

struct C10dCollectives::Impl {
  c10::intrusive_ptr<c10d::Store> store;  // Outlives the backend.
  c10::intrusive_ptr<CollectiveBackend> backend;
  bool nccl = false;
  torch::Device device = torch::kCPU;
};

C10dCollectives::C10dCollectives(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

C10dCollectives::~C10dCollectives() = default;

std::unique_ptr<C10dCollectives> C10dCollectives::CreateGloo(
    C10dStore& store, int rank, int world_size,
    std::chrono::milliseconds timeout, const GlooTransport& transport) {
  auto impl = std::make_unique<Impl>();
  impl->store =
      c10::make_intrusive<c10d::PrefixStore>("gloo", store.impl_->store);
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  options->devices.push_back(MakeGlooDevice(transport));
  options->threads = 2;
  impl->backend = c10::make_intrusive<c10d::ProcessGroupGloo>(
      impl->store, rank, world_size, options);
  return std::unique_ptr<C10dCollectives>(new C10dCollectives(std::move(impl)));
}

bool C10dCollectives::NcclAvailable() {
#ifdef LORAPLEX_WITH_NCCL
  return true;
#else
  return false;
#endif
}

std::unique_ptr<C10dCollectives> C10dCollectives::CreateNccl(
    C10dStore& store, int rank, int world_size,
    std::chrono::milliseconds timeout, torch::Device device) {
#ifdef LORAPLEX_WITH_NCCL
  auto impl = std::make_unique<Impl>();
  impl->store =
      c10::make_intrusive<c10d::PrefixStore>("nccl", store.impl_->store);
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  impl->backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(
      impl->store, rank, world_size, options);
  impl->nccl = true;
  impl->device = device;
  return std::unique_ptr<C10dCollectives>(new C10dCollectives(std::move(impl)));
#else
  (void)store;
  (void)rank;
  (void)world_size;
  (void)timeout;
  (void)device;
  TORCH_CHECK(false,
              "this build has no NCCL (CMake option LORAPLEX_WITH_NCCL)");
#endif
}

void C10dCollectives::AllReduceSum(torch::Tensor& tensor) {
  std::vector<at::Tensor> tensors{tensor};
  impl_->backend->allreduce(tensors)->wait();
}

void C10dCollectives::Broadcast(torch::Tensor& tensor, int root) {
  std::vector<at::Tensor> tensors{tensor};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  impl_->backend->broadcast(tensors, options)->wait();
}

void C10dCollectives::AllGather(const torch::Tensor& shard,
                                torch::Tensor& full) {
  std::vector<at::Tensor> inputs{shard};
  // Views of `full`: the backend copies each rank's shard into its own.
  std::vector<std::vector<at::Tensor>> outputs{
      full.chunk(static_cast<int64_t>(full.numel() / shard.numel()))};
  impl_->backend->allgather(outputs, inputs)->wait();
}

std::function<void()> C10dCollectives::StartAllGather(
    const torch::Tensor& shard, torch::Tensor& full) {
  std::vector<at::Tensor> inputs{shard};
  std::vector<std::vector<at::Tensor>> outputs{
      full.chunk(static_cast<int64_t>(full.numel() / shard.numel()))};
  auto work = impl_->backend->allgather(outputs, inputs);
  // The backend reads the vectors' tensors until the work completes.
  return [work, inputs = std::move(inputs), outputs = std::move(outputs)]() {
    work->wait();
  };
}

void C10dCollectives::Barrier() {
  if (impl_->nccl) {
    // NCCL's barrier picks a device by guessing from the rank; a one-element
    // all-reduce on the current device does the same job without guessing.
    torch::Tensor token = torch::zeros(
        {1}, torch::TensorOptions().dtype(torch::kFloat).device(impl_->device));
    AllReduceSum(token);
    token.cpu();
    return;
  }
  impl_->backend->barrier()->wait();
}

}  // namespace loraplex
