// The server's metrics in the Prometheus text format (version 0.0.4), for
// GET /metrics on the HTTP listener:
//
//   loraplex_slots{state="busy"} 3
//   loraplex_job_loss{tenant="alice",job="job-..."} 1.25
//
// Server-wide: slots (busy, free), jobs by status, training pass time,
// checkpoint time and failures, and calls answered by transport, method and
// code. Per running job (its tenant a label): step, total steps, loss, lr,
// grad norm, tokens/s, tokens and skipped steps, from the job's newest
// stored metrics, and when it last stepped. Per session slot: step, lr and
// when it last stepped. `tenant` empty: every tenant's series; otherwise
// only that tenant's (the server-wide ones always).
#ifndef LORAPLEX_SERVER_HTTP_METRICS_H_
#define LORAPLEX_SERVER_HTTP_METRICS_H_

#include <string>

#include "absl/status/statusor.h"
#include "server/edges/service_context.h"

namespace httplib {
class Server;
}  // namespace httplib

namespace loraplex {

absl::StatusOr<std::string> PrometheusMetrics(const ServiceContext& context,
                                              const std::string& tenant);

// GET /metrics: with --tokens-file, a tenant's token (X-API-Key, or
// "Authorization: Bearer <token>" as Prometheus' scrape config sends it)
// shows that tenant's series.
void RegisterMetrics(httplib::Server& server, const ServiceContext* context);

// A sample value as the text format writes it: the shortest decimal that
// reads back as `value` (all digits of timestamps and large counters),
// NaN, +Inf or -Inf.
std::string PrometheusValue(double value);

// A label value escaped as the text format requires (\\, \", \n).
std::string PrometheusLabel(absl::string_view value);

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_HTTP_METRICS_H_
