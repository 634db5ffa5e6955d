#include "client/progress_bar.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace loraplex {
namespace {

// A field of a progress line and how readily it is dropped to fit.
struct Field {
  std::string text;
  int drop_order;  // Higher goes first; 0 is never dropped.
};

constexpr int kKeep = 0;

double Fraction(const ProgressSnapshot& snapshot) {
  if (snapshot.total_steps <= 0) return 0;
  return std::clamp(static_cast<double>(snapshot.step) /
                        static_cast<double>(snapshot.total_steps),
                    0.0, 1.0);
}

std::string FormatLoss(double loss) {
  if (!std::isfinite(loss)) return absl::StrCat("loss ", loss);
  return absl::StrFormat("loss %.4f", loss);
}

// The fields after the label and status, in display order.
std::vector<Field> MetricFields(const ProgressSnapshot& snapshot,
                                bool with_bar_counts) {
  std::vector<Field> fields;
  if (snapshot.total_steps > 0) {
    const int percent = static_cast<int>(std::floor(Fraction(snapshot) * 100));
    fields.push_back(
        {with_bar_counts
             ? absl::StrCat(snapshot.step, "/", snapshot.total_steps, " ",
                            percent, "%")
             : absl::StrCat("step ", snapshot.step, "/", snapshot.total_steps,
                            " (", percent, "%)"),
         kKeep});
  } else {
    fields.push_back({absl::StrCat("step ", snapshot.step), kKeep});
  }
  if (snapshot.loss.has_value()) {
    fields.push_back({FormatLoss(*snapshot.loss), 3});
  }
  if (snapshot.validation_loss.has_value()) {
    fields.push_back(
        {absl::StrFormat("val %.4f", *snapshot.validation_loss), 2});
  }
  if (snapshot.lr.has_value()) {
    fields.push_back({absl::StrFormat("lr %.2e", *snapshot.lr), 6});
  }
  if (snapshot.tokens_per_second.has_value()) {
    fields.push_back(
        {absl::StrCat(FormatCount(*snapshot.tokens_per_second), " tok/s"), 5});
  }
  if (snapshot.total_steps > 0 && snapshot.eta_seconds.has_value()) {
    fields.push_back(
        {absl::StrCat("ETA ", FormatDuration(*snapshot.eta_seconds)), 4});
  }
  return fields;
}

std::string JoinFields(const std::vector<Field>& fields) {
  std::vector<absl::string_view> texts;
  for (const Field& field : fields) texts.push_back(field.text);
  return absl::StrJoin(texts, "  ");
}

}  // namespace

std::string FormatBar(double fraction, int width) {
  width = std::max(width, 3);
  const int inner = width - 2;
  if (!std::isfinite(fraction)) fraction = 0;
  fraction = std::clamp(fraction, 0.0, 1.0);
  const int filled = static_cast<int>(std::floor(fraction * inner));
  return absl::StrCat("[", std::string(filled, '#'),
                      std::string(inner - filled, '.'), "]");
}

std::string FormatProgressLine(const ProgressSnapshot& snapshot, int width) {
  // Label and status sit before the bar; the rest after it.
  std::vector<Field> head;
  if (!snapshot.label.empty()) head.push_back({snapshot.label, kKeep});
  if (!snapshot.status.empty()) head.push_back({snapshot.status, 1});
  std::vector<Field> tail = MetricFields(snapshot, /*with_bar_counts=*/true);

  auto text_width = [&]() {
    const std::string head_text = JoinFields(head);
    const std::string tail_text = JoinFields(tail);
    return static_cast<int>(head_text.size() + tail_text.size()) +
           (head.empty() || tail.empty() ? 0 : 2);
  };
  const bool want_bar = snapshot.total_steps > 0;
  if (width > 0) {
    // Drop fields until the text and a smallest bar fit (or nothing more
    // can be dropped).
    while (true) {
      const int needed = text_width() + (want_bar ? kMinBarWidth + 1 : 0);
      if (needed <= width) break;
      int worst = kKeep;
      std::vector<Field>* worst_list = nullptr;
      size_t worst_index = 0;
      for (std::vector<Field>* list : {&head, &tail}) {
        for (size_t i = 0; i < list->size(); ++i) {
          if ((*list)[i].drop_order > worst) {
            worst = (*list)[i].drop_order;
            worst_list = list;
            worst_index = i;
          }
        }
      }
      if (worst_list == nullptr) break;
      worst_list->erase(worst_list->begin() +
                        static_cast<std::ptrdiff_t>(worst_index));
    }
  }
  int bar_width = 0;
  if (want_bar) {
    bar_width = width > 0 ? std::min(kMaxBarWidth, width - text_width() - 1)
                          : kMaxBarWidth;
    if (bar_width < kMinBarWidth) bar_width = 0;
  }
  std::string line = JoinFields(head);
  if (bar_width > 0) {
    if (!line.empty()) line += " ";
    line += FormatBar(Fraction(snapshot), bar_width);
    if (!tail.empty()) line += " ";
  } else if (!line.empty() && !tail.empty()) {
    line += "  ";
  }
  line += JoinFields(tail);
  if (width > 0 && static_cast<int>(line.size()) > width) {
    line.resize(static_cast<size_t>(width));
  }
  return line;
}

std::string FormatProgressText(const ProgressSnapshot& snapshot) {
  std::vector<Field> fields;
  if (!snapshot.label.empty()) fields.push_back({snapshot.label, kKeep});
  if (!snapshot.status.empty()) fields.push_back({snapshot.status, kKeep});
  for (Field& field : MetricFields(snapshot, /*with_bar_counts=*/false)) {
    fields.push_back(std::move(field));
  }
  return JoinFields(fields);
}

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  // Round up so a last partial second still shows as "1s", not "0s".
  const int64_t total = static_cast<int64_t>(std::ceil(seconds));
  const int64_t days = total / 86400;
  const int64_t hours = (total / 3600) % 24;
  const int64_t minutes = (total / 60) % 60;
  const int64_t secs = total % 60;
  if (days > 0) return absl::StrFormat("%dd%02dh", days, hours);
  if (hours > 0) return absl::StrFormat("%dh%02dm", hours, minutes);
  if (minutes > 0) return absl::StrFormat("%dm%02ds", minutes, secs);
  return absl::StrFormat("%ds", secs);
}

std::string FormatCount(double value) {
  if (!std::isfinite(value)) return absl::StrCat(value);
  const double magnitude = std::fabs(value);
  struct Unit {
    double scale;
    const char* suffix;
  };
  for (const Unit& unit : {Unit{1e9, "G"}, Unit{1e6, "M"}, Unit{1e3, "k"}}) {
    if (magnitude >= unit.scale) {
      const double scaled = value / unit.scale;
      // Three significant digits: 1.23k, 12.3k, 123k.
      const int decimals = std::fabs(scaled) >= 100  ? 0
                           : std::fabs(scaled) >= 10 ? 1
                                                     : 2;
      return absl::StrFormat("%.*f%s", decimals, scaled, unit.suffix);
    }
  }
  return absl::StrFormat("%.0f", value);
}

void StepRateEstimator::Add(int64_t step, double time_seconds) {
  if (!samples_.empty() &&
      (step < samples_.back().first || time_seconds < samples_.back().second)) {
    samples_.clear();
  }
  samples_.emplace_back(step, time_seconds);
  while (static_cast<int>(samples_.size()) > std::max(window_, 2)) {
    samples_.pop_front();
  }
}

std::optional<double> StepRateEstimator::StepsPerSecond() const {
  if (samples_.size() < 2) return std::nullopt;
  const double steps =
      static_cast<double>(samples_.back().first - samples_.front().first);
  const double seconds = samples_.back().second - samples_.front().second;
  if (steps <= 0 || seconds <= 0) return std::nullopt;
  return steps / seconds;
}

std::optional<double> StepRateEstimator::EtaSeconds(int64_t step,
                                                    int64_t total_steps) const {
  if (total_steps <= 0) return std::nullopt;
  if (step >= total_steps) return 0.0;
  const std::optional<double> rate = StepsPerSecond();
  if (!rate.has_value()) return std::nullopt;
  return static_cast<double>(total_steps - step) / *rate;
}

bool PlainProgressThrottle::ShouldPrint(int64_t step, int64_t total_steps,
                                        double now_seconds) {
  if (step == last_step_) return false;
  int64_t bucket = -1;
  if (total_steps > 0 && progress_fraction_ > 0) {
    const double fraction = std::clamp(
        static_cast<double>(step) / static_cast<double>(total_steps), 0.0, 1.0);
    // The epsilon keeps 0.3 / 0.1 in bucket 3 despite rounding.
    bucket =
        static_cast<int64_t>(std::floor(fraction / progress_fraction_ + 1e-9));
  }
  const bool print = !printed_any_ ||
                     (total_steps > 0 && step >= total_steps) ||
                     bucket > last_bucket_ ||
                     now_seconds - last_time_ >= min_interval_seconds_;
  if (!print) return false;
  printed_any_ = true;
  last_time_ = now_seconds;
  last_bucket_ = std::max(last_bucket_, bucket);
  last_step_ = step;
  return true;
}

}  // namespace loraplex
