#include "core/dist/process_group.h"

#include <torch/torch.h>

#include <cmath>
#include <exception>
#include <map>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/runtime/exception_message.h"

namespace loraplex {
namespace {

constexpr char kJoinedKey[] = "loraplex/dist/joined";
constexpr std::chrono::milliseconds kJoinPoll{20};

bool IsLoopback(const std::string& host) {
  return host == "localhost" || absl::StartsWith(host, "127.") || host == "::1";
}

// Concatenates the flattened tensors[indices] (one dtype) into one buffer.
torch::Tensor Flatten(const std::vector<torch::Tensor>& tensors,
                      const std::vector<size_t>& indices) {
  std::vector<torch::Tensor> pieces;
  pieces.reserve(indices.size());
  for (size_t i : indices) pieces.push_back(tensors[i].reshape({-1}));
  return torch::cat(pieces);
}

// Copies consecutive pieces of `flat` back into tensors[indices].
void Unflatten(const torch::Tensor& flat, std::vector<torch::Tensor>& tensors,
               const std::vector<size_t>& indices) {
  int64_t offset = 0;
  for (size_t i : indices) {
    const int64_t n = tensors[i].numel();
    tensors[i].copy_(flat.narrow(0, offset, n).view(tensors[i].sizes()));
    offset += n;
  }
}

int64_t BufferBytes(const std::vector<torch::Tensor>& tensors,
                    const std::vector<size_t>& indices) {
  int64_t bytes = 0;
  for (size_t i : indices) {
    bytes +=
        tensors[i].numel() * static_cast<int64_t>(tensors[i].element_size());
  }
  return bytes;
}

}  // namespace

absl::StatusOr<std::vector<std::vector<size_t>>> PlanBuckets(
    const std::vector<torch::Tensor>& tensors, int64_t bucket_bytes) {
  if (bucket_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("bucket_bytes must be >= 1, got ", bucket_bytes));
  }
  // Per dtype, in order of first appearance: the buckets built so far and
  // the fill of the last one.
  std::vector<torch::ScalarType> dtypes;
  std::map<torch::ScalarType, std::vector<std::vector<size_t>>> by_dtype;
  std::map<torch::ScalarType, int64_t> last_fill;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].defined()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensors[", i, "] is undefined"));
    }
    if (tensors[i].numel() == 0) continue;
    const torch::ScalarType dtype = tensors[i].scalar_type();
    const int64_t bytes =
        tensors[i].numel() * static_cast<int64_t>(tensors[i].element_size());
    auto [it, inserted] = by_dtype.try_emplace(dtype);
    if (inserted) dtypes.push_back(dtype);
    std::vector<std::vector<size_t>>& buckets = it->second;
    int64_t& fill = last_fill[dtype];
    if (buckets.empty() || fill + bytes > bucket_bytes) {
      buckets.emplace_back();
      fill = 0;
    }
    buckets.back().push_back(i);
    fill += bytes;
  }
  std::vector<std::vector<size_t>> plan;
  for (torch::ScalarType dtype : dtypes) {
    for (std::vector<size_t>& bucket : by_dtype[dtype]) {
      plan.push_back(std::move(bucket));
    }
  }
  return plan;
}

DistContext::DistContext(const DistEnv& env, torch::Device device)
    : rank_(env.rank),
      world_size_(env.world_size),
      device_(device),
      address_(absl::StrCat(env.master_addr, ":", env.master_port)),
      timeout_(env.timeout) {}

DistContext::DistContext(DistContext&&) noexcept = default;
DistContext& DistContext::operator=(DistContext&&) noexcept = default;
DistContext::~DistContext() = default;

absl::StatusOr<DistContext> DistContext::Create(const DistEnv& env,
                                                torch::Device device) {
  if (env.world_size < 1 || env.rank < 0 || env.rank >= env.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("RANK must be in [0, WORLD_SIZE), got ", env.rank,
                     " with WORLD_SIZE ", env.world_size));
  }
  const bool cuda = device.is_cuda();
  if (!cuda && !device.is_cpu()) {
    return absl::InvalidArgumentError(
        absl::StrCat("device must be cpu or cuda, got ", device.str()));
  }
  DistContext context(env, device);
  if (env.world_size == 1) return context;
  if (cuda && !C10dCollectives::NcclAvailable()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "device ", device.str(),
        " needs NCCL for collectives; configure with -DLORAPLEX_WITH_NCCL=ON"));
  }

  const auto timeout =
      std::chrono::duration_cast<std::chrono::milliseconds>(env.timeout);
  const std::string where =
      absl::StrCat("MASTER_ADDR:MASTER_PORT ", context.address_);
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + timeout;
  try {
    context.store_ =
        std::make_unique<C10dStore>(env.master_addr, env.master_port,
                                    env.rank == 0, env.world_size, timeout);
  } catch (const std::exception& e) {
    if (env.rank == 0) {
      return absl::UnavailableError(
          absl::StrCat("rank 0 could not host the rendezvous store at ", where,
                       ": ", ExceptionMessage(e)));
    }
    const std::string text = absl::StrCat(
        "rank ", env.rank, " could not reach the rendezvous store at ", where,
        " (hosted by rank 0) within ", env.timeout.count(),
        " s: ", ExceptionMessage(e));
    // c10d retries the connection until its timeout; an early failure (an
    // unknown host) is not a timeout.
    if (std::chrono::steady_clock::now() - start >= timeout / 2) {
      return absl::DeadlineExceededError(text);
    }
    return absl::UnavailableError(text);
  }

  int64_t joined = 0;
  try {
    joined = context.store_->Add(kJoinedKey, 1);
    while (joined < env.world_size &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(kJoinPoll);
      joined = context.store_->Add(kJoinedKey, 0);
    }
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("rank ", env.rank, " lost the rendezvous store at ", where,
                     " while waiting for the other ranks (", joined, " of ",
                     env.world_size, " had joined): ", ExceptionMessage(e)));
  }
  if (joined < env.world_size) {
    return absl::DeadlineExceededError(
        absl::StrCat("rendezvous at ", where, " timed out after ",
                     env.timeout.count(), " s on rank ", env.rank, ": ", joined,
                     " of ", env.world_size, " ranks (WORLD_SIZE) joined"));
  }

  try {
    if (cuda) {
      context.comm_ = C10dCollectives::CreateNccl(
          *context.store_, env.rank, env.world_size, timeout, device);
    } else {
      GlooTransport transport;
      if (IsLoopback(env.master_addr)) {
        transport.hostname = env.master_addr;
      } else {
        transport.interface = env.gloo_socket_ifname;
      }
      context.comm_ = C10dCollectives::CreateGloo(
          *context.store_, env.rank, env.world_size, timeout, transport);
    }
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        "rank ", env.rank, " could not connect the ", cuda ? "NCCL" : "Gloo",
        " process group of ", env.world_size, " ranks (store at ", where,
        "): ", ExceptionMessage(e)));
  }
  return context;
}

template <typename Op>
absl::Status DistContext::Guarded(const char* name, Op&& op) {
  try {
    torch::NoGradGuard no_grad;
    op();
  } catch (const std::exception& e) {
    absl::Status status = absl::UnavailableError(
        absl::StrCat(name, " failed on rank ", rank_, " of ", world_size_,
                     " (store at ", address_, "): ", ExceptionMessage(e)));
    if (failure_.ok()) failure_ = status;
    return status;
  }
  return absl::OkStatus();
}

absl::Status DistContext::CheckTensors(
    const std::vector<torch::Tensor>& tensors, const char* what) const {
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].defined()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, "[", i, "] is undefined"));
    }
    if (tensors[i].device() != device_) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, "[", i, "] must be on ", device_.str(), ", got ",
                       tensors[i].device().str()));
    }
  }
  return absl::OkStatus();
}

absl::Status DistContext::Barrier() {
  if (world_size_ == 1) return absl::OkStatus();
  ++counters_.collectives;
  return Guarded("Barrier", [&] { comm_->Barrier(); });
}

absl::StatusOr<int> DistContext::CountRanks(bool flag) {
  if (world_size_ == 1) return flag ? 1 : 0;
  std::vector<torch::Tensor> count = {
      torch::full({1}, flag ? 1.0f : 0.0f,
                  torch::TensorOptions().device(device_).dtype(torch::kFloat))};
  LORAPLEX_RETURN_IF_ERROR(AllReduceSum(count, kDefaultBucketBytes));
  return static_cast<int>(std::lround(count[0].cpu().item<float>()));
}

absl::Status DistContext::CheckRoot(const char* op, int root) const {
  if (root < 0 || root >= world_size_) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": root must be in [0, ", world_size_, "), got ", root));
  }
  return absl::OkStatus();
}

absl::Status DistContext::Broadcast(std::string* bytes, int root) {
  if (bytes == nullptr) {
    return absl::InvalidArgumentError("Broadcast: bytes must not be null");
  }
  LORAPLEX_RETURN_IF_ERROR(CheckRoot("Broadcast", root));
  if (world_size_ == 1) return absl::OkStatus();
  const bool sending = rank_ == root;
  return Guarded("Broadcast", [&] {
    const auto on_device = torch::TensorOptions().device(device_);
    torch::Tensor length = torch::full(
        {1}, sending ? static_cast<int64_t>(bytes->size()) : int64_t{0},
        on_device.dtype(torch::kLong));
    comm_->Broadcast(length, root);
    ++counters_.collectives;
    const int64_t n = length.cpu().item<int64_t>();
    int64_t moved = length.element_size();
    if (n > 0) {
      torch::Tensor buffer;
      if (sending) {
        buffer = torch::from_blob(bytes->data(), {n}, torch::kUInt8)
                     .to(device_, /*non_blocking=*/false, /*copy=*/true);
      } else {
        buffer = torch::empty({n}, on_device.dtype(torch::kUInt8));
      }
      comm_->Broadcast(buffer, root);
      ++counters_.collectives;
      moved += n;
      if (!sending) {
        torch::Tensor host = buffer.cpu().contiguous();
        bytes->assign(reinterpret_cast<const char*>(host.data_ptr<uint8_t>()),
                      static_cast<size_t>(n));
      }
    } else if (!sending) {
      bytes->clear();
    }
    if (sending) {
      counters_.broadcast_sent_bytes += moved;
    } else {
      counters_.broadcast_received_bytes += moved;
    }
  });
}

absl::Status DistContext::BroadcastValue(int64_t* value, int root) {
  if (value == nullptr) {
    return absl::InvalidArgumentError("BroadcastValue: value must not be null");
  }
  LORAPLEX_RETURN_IF_ERROR(CheckRoot("BroadcastValue", root));
  if (world_size_ == 1) return absl::OkStatus();
  return Guarded("BroadcastValue", [&] {
    torch::Tensor t =
        torch::full({1}, *value,
                    torch::TensorOptions().device(device_).dtype(torch::kLong));
    comm_->Broadcast(t, root);
    ++counters_.collectives;
    *value = t.cpu().item<int64_t>();
    if (rank_ == root) {
      counters_.broadcast_sent_bytes += t.element_size();
    } else {
      counters_.broadcast_received_bytes += t.element_size();
    }
  });
}

absl::Status DistContext::AllReduceMean(std::vector<torch::Tensor>& tensors,
                                        int64_t bucket_bytes) {
  return AllReduce(tensors, bucket_bytes, /*mean=*/true);
}

absl::Status DistContext::AllReduceSum(std::vector<torch::Tensor>& tensors,
                                       int64_t bucket_bytes) {
  return AllReduce(tensors, bucket_bytes, /*mean=*/false);
}

absl::Status DistContext::CheckGatherTensors(const torch::Tensor& shard,
                                             const torch::Tensor& full) const {
  LORAPLEX_RETURN_IF_ERROR(CheckTensors({shard, full}, "AllGather tensors"));
  if (!full.is_contiguous() || !shard.is_contiguous() ||
      full.scalar_type() != shard.scalar_type() ||
      full.numel() != shard.numel() * world_size_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AllGather needs contiguous tensors of one dtype, full holding ",
        world_size_, " x ", shard.numel(), " elements, got ", full.numel()));
  }
  return absl::OkStatus();
}

absl::Status DistContext::AllGather(const torch::Tensor& shard,
                                    torch::Tensor& full) {
  LORAPLEX_RETURN_IF_ERROR(CheckGatherTensors(shard, full));
  if (shard.numel() == 0) return absl::OkStatus();
  if (world_size_ == 1) {
    torch::NoGradGuard no_grad;
    full.copy_(shard.view(-1));
    return absl::OkStatus();
  }
  return Guarded("AllGather", [&] {
    comm_->AllGather(shard, full);
    ++counters_.collectives;
    counters_.all_gather_bytes += full.nbytes();
  });
}

absl::StatusOr<std::function<void()>> DistContext::StartAllGather(
    const torch::Tensor& shard, torch::Tensor& full) {
  LORAPLEX_RETURN_IF_ERROR(CheckGatherTensors(shard, full));
  if (shard.numel() == 0) return std::function<void()>([] {});
  if (world_size_ == 1) {
    torch::NoGradGuard no_grad;
    full.copy_(shard.view(-1));
    return std::function<void()>([] {});
  }
  std::function<void()> wait;
  LORAPLEX_RETURN_IF_ERROR(Guarded("AllGather", [&] {
    wait = comm_->StartAllGather(shard, full);
    ++counters_.collectives;
    counters_.all_gather_bytes += full.nbytes();
  }));
  return std::function<void()>([this, wait = std::move(wait)] {
    const absl::Status status = Guarded("AllGather", [&] { wait(); });
    TORCH_CHECK(status.ok(), status.ToString());
  });
}

absl::Status DistContext::AllReduce(std::vector<torch::Tensor>& tensors,
                                    int64_t bucket_bytes, bool mean) {
  LORAPLEX_RETURN_IF_ERROR(CheckTensors(tensors, "tensors"));
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!c10::isFloatingType(tensors[i].scalar_type())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensors[", i, "] must be floating point to reduce, got ",
          c10::toString(tensors[i].scalar_type())));
    }
  }
  LORAPLEX_ASSIGN_OR_RETURN(std::vector<std::vector<size_t>> buckets,
                            PlanBuckets(tensors, bucket_bytes));
  if (world_size_ == 1) return absl::OkStatus();
  return Guarded(mean ? "AllReduceMean" : "AllReduceSum", [&] {
    for (const std::vector<size_t>& bucket : buckets) {
      torch::Tensor flat = Flatten(tensors, bucket);
      comm_->AllReduceSum(flat);
      ++counters_.collectives;
      counters_.all_reduce_bytes += BufferBytes(tensors, bucket);
      if (mean) flat.div_(world_size_);
      Unflatten(flat, tensors, bucket);
    }
  });
}

absl::Status DistContext::BroadcastFromOwners(
    std::vector<torch::Tensor>& params, const std::vector<int>& owner,
    int64_t bucket_bytes) {
  if (owner.size() != params.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "owner has ", owner.size(), " entries for ", params.size(), " params"));
  }
  for (size_t i = 0; i < owner.size(); ++i) {
    if (owner[i] < 0 || owner[i] >= world_size_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "owner[", i, "] must be in [0, ", world_size_, "), got ", owner[i]));
    }
  }
  LORAPLEX_RETURN_IF_ERROR(CheckTensors(params, "params"));
  if (bucket_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("bucket_bytes must be >= 1, got ", bucket_bytes));
  }
  if (world_size_ == 1) return absl::OkStatus();

  // Per owner: its parameters, and their positions in `params`.
  std::vector<std::vector<torch::Tensor>> owned(world_size_);
  std::vector<std::vector<size_t>> positions(world_size_);
  for (size_t i = 0; i < params.size(); ++i) {
    owned[owner[i]].push_back(params[i]);
    positions[owner[i]].push_back(i);
  }
  std::vector<std::vector<std::vector<size_t>>> plans(world_size_);
  for (int r = 0; r < world_size_; ++r) {
    LORAPLEX_ASSIGN_OR_RETURN(plans[r], PlanBuckets(owned[r], bucket_bytes));
  }
  return Guarded("BroadcastFromOwners", [&] {
    for (int r = 0; r < world_size_; ++r) {
      const bool sending = r == rank_;
      for (const std::vector<size_t>& bucket : plans[r]) {
        const int64_t bytes = BufferBytes(owned[r], bucket);
        torch::Tensor flat;
        if (sending) {
          flat = Flatten(owned[r], bucket);
        } else {
          const torch::Tensor& first = owned[r][bucket.front()];
          flat =
              torch::empty({bytes / static_cast<int64_t>(first.element_size())},
                           first.options());
        }
        comm_->Broadcast(flat, r);
        ++counters_.collectives;
        if (sending) {
          counters_.broadcast_sent_bytes += bytes;
        } else {
          counters_.broadcast_received_bytes += bytes;
          Unflatten(flat, owned[r], bucket);
        }
      }
    }
  });
}

}  // namespace loraplex
