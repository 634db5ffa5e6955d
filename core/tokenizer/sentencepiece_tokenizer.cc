#include "core/tokenizer/sentencepiece_tokenizer.h"

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/common/status_macros.h"
#include "core/tokenizer/sentencepiece_shim.h"

namespace loraplex {
namespace {

namespace fs = std::filesystem;

// The opened shim and its entry points.
struct SpmLibrary {
  void* handle = nullptr;
  LoraplexSpmOpenFn open = nullptr;
  LoraplexSpmCloseFn close = nullptr;
  LoraplexSpmInfoFn info = nullptr;
  LoraplexSpmIsControlFn is_control = nullptr;
  LoraplexSpmEncodeFn encode = nullptr;
  LoraplexSpmEncodeOffsetsFn encode_offsets = nullptr;
  LoraplexSpmDecodeFn decode = nullptr;
  LoraplexSpmTrainFn train = nullptr;

  ~SpmLibrary() {
    if (handle != nullptr) dlclose(handle);
  }
};

std::vector<std::string> ShimCandidates() {
  std::vector<std::string> candidates;
  if (const char* override_path = std::getenv("LORAPLEX_SPM_SHIM")) {
    candidates.push_back(override_path);
  }
  std::error_code error;
  const fs::path exe = fs::read_symlink("/proc/self/exe", error);
  if (!error) {
    candidates.push_back((exe.parent_path() / LORAPLEX_SPM_SHIM_FILE).string());
    candidates.push_back((exe.parent_path().parent_path() / "lib" / "loraplex" /
                          LORAPLEX_SPM_SHIM_FILE)
                             .string());
  }
  candidates.push_back(LORAPLEX_SPM_SHIM_FILE);  // The loader's search path.
  return candidates;
}

template <typename Fn>
absl::Status Bind(void* handle, const char* name, Fn* fn) {
  *fn = reinterpret_cast<Fn>(dlsym(handle, name));
  if (*fn == nullptr) {
    return absl::InternalError(
        absl::StrCat(LORAPLEX_SPM_SHIM_FILE, " lacks ", name));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<SpmLibrary>> OpenShimOnce() {
  auto library = std::make_shared<SpmLibrary>();
  std::vector<std::string> failures;
  for (const std::string& candidate : ShimCandidates()) {
    library->handle =
        dlmopen(LM_ID_NEWLM, candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library->handle != nullptr) break;
    const char* error = dlerror();
    failures.push_back(error != nullptr ? error
                                        : candidate + ": unknown error");
  }
  if (library->handle == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "SentencePiece support is not available: cannot load ",
        LORAPLEX_SPM_SHIM_FILE, " (", absl::StrJoin(failures, "; "),
        "); set LORAPLEX_SPM_SHIM to its path"));
  }
  void* h = library->handle;
  LORAPLEX_RETURN_IF_ERROR(Bind(h, "loraplex_spm_open", &library->open));
  LORAPLEX_RETURN_IF_ERROR(Bind(h, "loraplex_spm_close", &library->close));
  LORAPLEX_RETURN_IF_ERROR(Bind(h, "loraplex_spm_info", &library->info));
  LORAPLEX_RETURN_IF_ERROR(
      Bind(h, "loraplex_spm_is_control", &library->is_control));
  LORAPLEX_RETURN_IF_ERROR(Bind(h, "loraplex_spm_encode", &library->encode));
  LORAPLEX_RETURN_IF_ERROR(
      Bind(h, "loraplex_spm_encode_offsets", &library->encode_offsets));
  LORAPLEX_RETURN_IF_ERROR(Bind(h, "loraplex_spm_decode", &library->decode));
  LORAPLEX_RETURN_IF_ERROR(Bind(h, "loraplex_spm_train", &library->train));
  return library;
}

// The shim lives in a link-map namespace of its own (dlmopen), with its own
// libc and libstdc++: sentencepiece's private protobuf then cannot clash with
// libprotobuf, and none of the known RTLD_DEEPBIND pitfalls (copy-relocated
// std::cerr) apply. glibc offers only 16 namespaces and cannot reclaim one
// that holds a libc, so the shim is opened once per process and kept: the
// one process-wide cache in loraplex, standing for a process-wide resource.
// A failed open is not cached, so fixing LORAPLEX_SPM_SHIM takes effect.
absl::StatusOr<std::shared_ptr<SpmLibrary>> OpenShim() {
  static std::mutex mutex;
  static std::shared_ptr<SpmLibrary>* opened = nullptr;
  std::lock_guard<std::mutex> lock(mutex);
  if (opened != nullptr) return *opened;
  LORAPLEX_ASSIGN_OR_RETURN(std::shared_ptr<SpmLibrary> library,
                            OpenShimOnce());
  opened = new std::shared_ptr<SpmLibrary>(library);
  return library;
}

class SentencePieceTokenizer : public Tokenizer {
 public:
  SentencePieceTokenizer(std::shared_ptr<SpmLibrary> library, void* model)
      : library_(std::move(library)), model_(model) {
    library_->info(model_, &vocab_size_, &bos_, &eos_, &pad_);
  }
  ~SentencePieceTokenizer() override { library_->close(model_); }

  absl::StatusOr<std::vector<int64_t>> Encode(
      std::string_view text) const override {
    std::vector<int32_t> ids(text.size() + 8);
    size_t count = library_->encode(model_, text.data(), text.size(),
                                    ids.data(), ids.size());
    if (count > ids.size()) {
      ids.resize(count);
      count = library_->encode(model_, text.data(), text.size(), ids.data(),
                               ids.size());
    }
    return std::vector<int64_t>(ids.begin(), ids.begin() + count);
  }

  absl::StatusOr<TokenizerEncoding> EncodeWithOffsets(
      std::string_view text) const override {
    size_t capacity = text.size() + 8;
    while (true) {
      std::vector<int32_t> ids(capacity);
      std::vector<uint32_t> begins(capacity), ends(capacity);
      const size_t count =
          library_->encode_offsets(model_, text.data(), text.size(), ids.data(),
                                   begins.data(), ends.data(), capacity);
      if (count > capacity) {
        capacity = count;
        continue;
      }
      TokenizerEncoding encoding;
      for (size_t i = 0; i < count; ++i) {
        encoding.ids.push_back(ids[i]);
        encoding.offsets.push_back({begins[i], ends[i]});
      }
      return encoding;
    }
  }

  absl::StatusOr<std::string> Decode(
      const std::vector<int64_t>& ids) const override {
    std::vector<int32_t> pieces;
    for (int64_t id : ids) {
      if (id >= 0 && id < vocab_size_ &&
          !library_->is_control(model_, static_cast<int32_t>(id))) {
        pieces.push_back(static_cast<int32_t>(id));
      }
    }
    std::string text(pieces.size() * 8 + 16, '\0');
    size_t size = library_->decode(model_, pieces.data(), pieces.size(),
                                   text.data(), text.size());
    if (size > text.size()) {
      text.resize(size);
      size = library_->decode(model_, pieces.data(), pieces.size(), text.data(),
                              text.size());
    }
    text.resize(size);
    return text;
  }

  int64_t vocab_size() const override { return vocab_size_; }
  std::optional<int64_t> bos_id() const override {
    return bos_ >= 0 ? std::optional<int64_t>(bos_) : std::nullopt;
  }
  int64_t eos_id() const override { return eos_; }
  int64_t pad_id() const override { return pad_ >= 0 ? pad_ : eos_; }

 private:
  std::shared_ptr<SpmLibrary> library_;
  void* model_;
  int32_t vocab_size_ = 0, bos_ = -1, eos_ = -1, pad_ = -1;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadSentencePieceTokenizer(
    const std::string& model_path) {
  LORAPLEX_ASSIGN_OR_RETURN(std::shared_ptr<SpmLibrary> library, OpenShim());
  char error[512] = {0};
  void* model = library->open(model_path.c_str(), error, sizeof(error));
  if (model == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(model_path, ": not a SentencePiece model: ", error));
  }
  auto tokenizer = std::make_unique<SentencePieceTokenizer>(library, model);
  if (tokenizer->eos_id() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(model_path, ": SentencePiece model has no EOS piece"));
  }
  return tokenizer;
}

absl::Status TrainSentencePieceModel(const std::string& args) {
  LORAPLEX_ASSIGN_OR_RETURN(std::shared_ptr<SpmLibrary> library, OpenShim());
  char error[512] = {0};
  if (library->train(args.c_str(), error, sizeof(error)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("SentencePiece training failed: ", error));
  }
  return absl::OkStatus();
}

}  // namespace loraplex
