#include "server/http/metrics.h"

#include <httplib.h>

#include <charconv>
#include <cmath>
#include <map>
#include <optional>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "server/http/http_listener.h"

namespace loraplex {
namespace {

// One metric family: its HELP and TYPE lines, then its samples.
class Family {
 public:
  Family(std::string name, std::string help, const char* type = "gauge")
      : name_(std::move(name)) {
    absl::StrAppend(&text_, "# HELP ", name_, " ", help, "\n# TYPE ", name_,
                    " ", type, "\n");
  }
  void Add(const std::vector<std::pair<std::string, std::string>>& labels,
           double value) {
    AddSample("", labels, value);
  }
  // A sample named name_ + suffix (a summary's "_sum" and "_count").
  void AddSample(absl::string_view suffix,
                 const std::vector<std::pair<std::string, std::string>>& labels,
                 double value) {
    absl::StrAppend(&text_, name_, suffix);
    if (!labels.empty()) {
      text_ += "{";
      for (size_t i = 0; i < labels.size(); ++i) {
        absl::StrAppend(&text_, i == 0 ? "" : ",", labels[i].first, "=\"",
                        PrometheusLabel(labels[i].second), "\"");
      }
      text_ += "}";
    }
    absl::StrAppend(&text_, " ", PrometheusValue(value), "\n");
  }
  const std::string& text() const { return text_; }

 private:
  std::string name_;
  std::string text_;
};

}  // namespace

std::string PrometheusValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char digits[64];
  const std::to_chars_result end =
      std::to_chars(digits, digits + sizeof(digits), value);
  return std::string(digits, end.ptr);
}

std::string PrometheusLabel(absl::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

absl::StatusOr<std::string> PrometheusMetrics(const ServiceContext& context,
                                              const std::string& tenant) {
  auto visible = [&](const std::string& owner) {
    return tenant.empty() || owner == tenant;
  };
  const std::vector<SlotInfo> slots = context.scheduler->Slots();
  int busy = 0;
  for (const SlotInfo& slot : slots) busy += slot.attached ? 1 : 0;
  Family slot_states("loraplex_slots", "Adapter slots by state.");
  slot_states.Add({{"state", "busy"}}, busy);
  slot_states.Add({{"state", "free"}},
                  static_cast<double>(slots.size()) - busy);

  const std::vector<JobStatus> statuses = {
      JobStatus::kQueued, JobStatus::kValidating, JobStatus::kRunning,
      JobStatus::kPaused};
  LORAPLEX_ASSIGN_OR_RETURN(std::vector<JobRecord> jobs,
                            context.store->JobsWithStatus(statuses));
  std::map<JobStatus, int> by_status;
  for (JobStatus status : statuses) by_status[status] = 0;
  for (const JobRecord& job : jobs) ++by_status[job.status];
  Family job_states("loraplex_jobs",
                    "Jobs that are not finished, by status (queued is the "
                    "queue length).");
  for (const auto& [status, count] : by_status) {
    job_states.Add({{"status", absl::AsciiStrToLower(JobStatusName(status))}},
                   count);
  }

  const TrainerStats stats = context.scheduler->Stats();
  Family step_seconds("loraplex_train_step_seconds",
                      "Wall time of the co-batched training passes (jobs' "
                      "and sessions' rows together).",
                      "summary");
  step_seconds.AddSample("_sum", {}, stats.step_seconds);
  step_seconds.AddSample("_count", {}, static_cast<double>(stats.steps));
  Family last_step("loraplex_train_step_last_seconds",
                   "Wall time of the newest training pass.");
  last_step.Add({}, stats.last_step_seconds);
  Family checkpoint_seconds(
      "loraplex_checkpoint_seconds",
      "Time of each slot checkpoint written, from gathering its state to "
      "its files synced to disk.",
      "summary");
  checkpoint_seconds.AddSample("_sum", {}, stats.checkpoint_seconds);
  checkpoint_seconds.AddSample("_count", {},
                               static_cast<double>(stats.checkpoints));
  Family last_checkpoint("loraplex_checkpoint_last_seconds",
                         "Time of the newest slot checkpoint written.");
  last_checkpoint.Add({}, stats.last_checkpoint_seconds);
  Family checkpoint_failures("loraplex_checkpoint_failures_total",
                             "Slot checkpoints that could not be written.",
                             "counter");
  checkpoint_failures.Add({}, static_cast<double>(stats.checkpoint_failures));
  Family requests("loraplex_requests_total",
                  "Calls answered, by transport (grpc, http), method (a gRPC "
                  "method, or an HTTP route with ids as {id}) and code (a "
                  "gRPC status code, or an HTTP status).",
                  "counter");
  if (context.requests != nullptr) {
    for (const RequestCount& count : context.requests->Snapshot()) {
      requests.Add({{"transport", count.transport},
                    {"method", count.method},
                    {"code", count.code}},
                   static_cast<double>(count.count));
    }
  }

  // When each slot's job or session last stepped.
  std::map<std::string, int64_t> job_stepped_ms;
  for (const SlotInfo& slot : slots) {
    if (slot.attached && !slot.job_id.empty()) {
      job_stepped_ms[slot.job_id] = slot.last_step_time_ms;
    }
  }

  Family step("loraplex_job_step", "The job's optimizer steps so far.");
  Family total("loraplex_job_total_steps", "The job's planned steps.");
  Family loss("loraplex_job_loss", "Training loss of the job's last step.");
  Family lr("loraplex_job_lr", "Learning rate of the job's last step.");
  Family grad("loraplex_job_grad_norm", "Gradient norm of the last step.");
  Family speed("loraplex_job_tokens_per_second",
               "Training tokens per second of the job's recent steps.");
  Family tokens("loraplex_job_tokens", "Tokens the job has trained on.",
                "counter");
  Family skipped("loraplex_job_skipped_steps",
                 "Steps skipped for a non-finite loss or gradient.", "counter");
  Family job_stepped("loraplex_job_last_step_timestamp_seconds",
                     "When the job's last step ended (Unix time; 0 before "
                     "its first step in its slot).");
  for (const JobRecord& job : jobs) {
    if (job.status != JobStatus::kRunning || !visible(job.tenant)) continue;
    const std::vector<std::pair<std::string, std::string>> labels = {
        {"tenant", job.tenant}, {"job", job.id}};
    step.Add(labels, static_cast<double>(job.metrics.step));
    total.Add(labels, static_cast<double>(job.total_steps));
    loss.Add(labels, job.metrics.loss);
    lr.Add(labels, job.metrics.lr);
    grad.Add(labels, job.metrics.grad_norm);
    speed.Add(labels, job.metrics.tokens_per_second);
    tokens.Add(labels, static_cast<double>(job.metrics.tokens));
    skipped.Add(labels, static_cast<double>(job.metrics.skipped_steps));
    auto stepped = job_stepped_ms.find(job.id);
    job_stepped.Add(labels, stepped == job_stepped_ms.end()
                                ? 0.0
                                : static_cast<double>(stepped->second) / 1e3);
  }

  Family session_step("loraplex_session_step",
                      "A training session's optimizer steps so far.");
  Family session_lr("loraplex_session_lr",
                    "Learning rate of the session's last step.");
  Family session_stepped("loraplex_session_last_step_timestamp_seconds",
                         "When the session's last optimizer step ended (Unix "
                         "time; 0 before its first).");
  for (size_t i = 0; i < slots.size(); ++i) {
    const SlotInfo& slot = slots[i];
    if (!slot.attached || slot.session_id.empty() || !visible(slot.tenant)) {
      continue;
    }
    const std::vector<std::pair<std::string, std::string>> labels = {
        {"tenant", slot.tenant},
        {"session", slot.session_id},
        {"slot", absl::StrCat(i)}};
    session_step.Add(labels, static_cast<double>(slot.step));
    session_lr.Add(labels, slot.lr);
    session_stepped.Add(labels,
                        static_cast<double>(slot.last_step_time_ms) / 1e3);
  }
  return absl::StrCat(
      slot_states.text(), job_states.text(), step_seconds.text(),
      last_step.text(), checkpoint_seconds.text(), last_checkpoint.text(),
      checkpoint_failures.text(), requests.text(), step.text(), total.text(),
      loss.text(), lr.text(), grad.text(), speed.text(), tokens.text(),
      skipped.text(), job_stepped.text(), session_step.text(),
      session_lr.text(), session_stepped.text());
}

void RegisterMetrics(httplib::Server& server, const ServiceContext* context) {
  server.Get("/metrics", [context](const httplib::Request& request,
                                   httplib::Response& response) {
    absl::StatusOr<std::string> text = [&]() -> absl::StatusOr<std::string> {
      std::string tenant;
      if (context->auth->requires_tokens()) {
        std::optional<std::string> key = ApiKeyHeader(request);
        const std::string authorization =
            request.get_header_value("Authorization");
        if (!key.has_value() &&
            absl::StartsWithIgnoreCase(authorization, "Bearer ")) {
          key = authorization.substr(7);
        }
        LORAPLEX_ASSIGN_OR_RETURN(tenant,
                                  context->auth->AuthenticateApiKey(key));
      }
      return PrometheusMetrics(*context, tenant);
    }();
    if (!text.ok()) {
      response.status =
          text.status().code() == absl::StatusCode::kUnauthenticated ? 401
                                                                     : 500;
      response.set_content(std::string(text.status().message()) + "\n",
                           "text/plain");
      return;
    }
    response.set_content(*text, "text/plain; version=0.0.4; charset=utf-8");
  });
}

}  // namespace loraplex
