#include "server/trainer/report_gate.h"

namespace loraplex {

ReportGate::ReportGate(JobTrainer::ReportSink sink, std::function<void()> wake)
    : sink_(std::move(sink)), wake_(std::move(wake)) {}

void ReportGate::Report(TrainerReport report) {
  if (held_.empty() && groups_written_ == groups_queued_) {
    sink_(std::move(report));
    return;
  }
  held_.emplace_back(groups_queued_, std::move(report));
}

std::function<void()> ReportGate::QueueGroup() {
  ++groups_queued_;
  return [this] {
    {
      absl::MutexLock lock(&mu_);
      ++groups_done_;
    }
    wake_();
  };
}

void ReportGate::Written(TrainerReport report) {
  {
    absl::MutexLock lock(&mu_);
    written_.push_back(std::move(report));
  }
  wake_();
}

bool ReportGate::pending() const {
  absl::MutexLock lock(&mu_);
  return !written_.empty() || groups_done_ != groups_written_;
}

void ReportGate::Flush(bool deliver) {
  std::vector<TrainerReport> written;
  {
    absl::MutexLock lock(&mu_);
    written.swap(written_);
    groups_written_ = groups_done_;
  }
  // What was reported while the ranks were sound is delivered even if they
  // broke since.
  if (!deliver) return;
  while (!held_.empty() && held_.front().first <= groups_written_) {
    sink_(std::move(held_.front().second));
    held_.pop_front();
  }
  for (TrainerReport& report : written) {
    // Checkpoints are reported as soon as they are written; anything else
    // (a job's end) after the reports before it.
    if (report.kind == TrainerReport::Kind::kCheckpoint) {
      sink_(std::move(report));
    } else {
      Report(std::move(report));
    }
  }
}

}  // namespace loraplex
