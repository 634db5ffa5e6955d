#include "server/http/metrics.h"

#include <httplib.h>

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
    text_ += name_;
    if (!labels.empty()) {
      text_ += "{";
      for (size_t i = 0; i < labels.size(); ++i) {
        absl::StrAppend(&text_, i == 0 ? "" : ",", labels[i].first, "=\"",
                        PrometheusLabel(labels[i].second), "\"");
      }
      text_ += "}";
    }
    absl::StrAppend(&text_, " ", value, "\n");
  }
  const std::string& text() const { return text_; }

 private:
  std::string name_;
  std::string text_;
};

}  // namespace

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
  }

  Family session_step("loraplex_session_step",
                      "A training session's optimizer steps so far.");
  Family session_lr("loraplex_session_lr",
                    "Learning rate of the session's last step.");
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
  }
  return absl::StrCat(slot_states.text(), job_states.text(), step.text(),
                      total.text(), loss.text(), lr.text(), grad.text(),
                      speed.text(), tokens.text(), skipped.text(),
                      session_step.text(), session_lr.text());
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
