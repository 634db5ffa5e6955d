// What any gRPC server is expected to offer: TLS, health checking,
// reflection (what grpcurl uses) and INVALID_ARGUMENT for a request that
// does not parse. Health and reflection are spoken as raw protobuf bytes
// since their .proto files are not installed.
#include <gmock/gmock.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/client_unary_call.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/common/test_dir.h"
#include "tests/common/tls_files.h"
#include "tests/server/raw_grpc_call.h"
#include "tests/server/service_fixture.h"

namespace loraplex {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Bytes(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return bytes;
}

// One unary call of `method` with the encoded request `body` (any bytes);
// the encoded response in *response.
grpc::Status RawUnaryCall(const std::shared_ptr<grpc::Channel>& channel,
                          const std::string& method, const std::string& body,
                          std::string* response) {
  grpc::Slice slice(body);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer answer;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  grpc::Status status =
      grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
          channel.get(),
          grpc::internal::RpcMethod(method.c_str(),
                                    grpc::internal::RpcMethod::NORMAL_RPC),
          &context, request, &answer);
  if (status.ok()) *response = Bytes(answer);
  return status;
}

// One grpc.health.v1.Health/Check call with the encoded request `body`.
grpc::Status HealthCheck(const std::shared_ptr<grpc::Channel>& channel,
                         const std::string& body, std::string* response) {
  return RawUnaryCall(channel, "/grpc.health.v1.Health/Check", body, response);
}

// A request that does not parse as its method's message is INVALID_ARGUMENT
// saying so (gRPC's callback handlers answer it UNIMPLEMENTED, as if the
// method did not exist), and the server goes on serving.
TEST(ServiceRequestParsingTest, UnparsableRequestsAreInvalidArgument) {
  auto server = StartServer(FreshTestDir("state"), 1);
  ASSERT_NE(server, nullptr);
  auto channel = grpc::CreateChannel(server->address(),
                                     grpc::InsecureChannelCredentials());
  struct Case {
    std::string method;
    std::string body;
    std::string what;
  };
  const std::string overlong_varint =
      std::string("\x08") + std::string(10, '\xff') + "\x01";
  const std::vector<Case> cases = {
      {"/loraplex.v1.JobService/GetJob", std::string("\x0a\x05", 2) + "ab",
       "truncated string field"},
      {"/loraplex.v1.JobService/CreateJob",
       std::string("\x1a\x40", 2) + "datasets/", "truncated string field"},
      {"/loraplex.v1.DatasetService/ListDatasets", overlong_varint,
       "11-byte varint"},
      {"/loraplex.v1.DatasetService/GetDataset",
       std::string("\x0a\x02\xc3\x28", 4), "string field not UTF-8"},
      {"/loraplex.v1.ServerService/GetServerInfo", overlong_varint,
       "11-byte varint"},
  };
  for (const Case& c : cases) {
    std::string response;
    grpc::Status status = RawUnaryCall(channel, c.method, c.body, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << c.method << ", " << c.what << ": " << status.error_message();
    EXPECT_THAT(status.error_message(),
                HasSubstr("the request could not be parsed as the message " +
                          c.method + " takes"))
        << c.what;
    // The next request of the same method, the empty message, reaches the
    // handler (which may find fields missing).
    status = RawUnaryCall(channel, c.method, "", &response);
    EXPECT_NE(status.error_code(), grpc::StatusCode::UNIMPLEMENTED)
        << c.method << ": " << status.error_message();
    EXPECT_THAT(status.error_message(), Not(HasSubstr("could not be parsed")))
        << c.method;
  }
  // Server-streaming methods take their request parsed by gRPC too.
  for (const std::string method :
       {"/loraplex.v1.JobService/WatchJob",
        "/loraplex.v1.SamplingService/StreamSample"}) {
    grpc::Status status =
        RawStreamingCall(channel, method, {overlong_varint}, 10);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << method << ": " << status.error_message();
    EXPECT_THAT(status.error_message(),
                HasSubstr("the request could not be parsed"));
  }
  // Well-formed requests: a missing job is NOT_FOUND, a method the server
  // lacks is still UNIMPLEMENTED, and the client's calls succeed.
  std::string response;
  EXPECT_EQ(RawUnaryCall(channel, "/loraplex.v1.JobService/GetJob",
                         std::string("\x0a\x0cjobs/missing", 14), &response)
                .error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(RawUnaryCall(channel, "/loraplex.v1.JobService/NoSuchMethod",
                         overlong_varint, &response)
                .error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  auto client = ClientFor(*server);
  auto info = client->GetServerInfo();
  EXPECT_TRUE(info.ok()) << info.status();
  auto jobs = client->ListAllJobs();
  EXPECT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_TRUE(server->Stop().ok()) << server->Log();
}

TEST(ServiceHealthTest, StandardHealthServiceReportsServing) {
  auto server = StartServer(FreshTestDir("state"), 1);
  ASSERT_NE(server, nullptr);
  auto channel = grpc::CreateChannel(server->address(),
                                     grpc::InsecureChannelCredentials());
  // grpc.health.v1.HealthCheckRequest{service: ""} is the empty message;
  // the answer HealthCheckResponse{status: SERVING} encodes as 08 01.
  std::string response;
  grpc::Status status = HealthCheck(channel, "", &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response, std::string("\x08\x01", 2));
  // By service name too: HealthCheckRequest{service: NAME} is field 1.
  for (const std::string name :
       {"loraplex.v1.DatasetService", "loraplex.v1.JobService",
        "loraplex.v1.AdapterService", "loraplex.v1.ServerService",
        "loraplex.v1.SamplingService", "loraplex.v1.NoSuchService"}) {
    status = HealthCheck(
        channel, std::string("\x0a") + static_cast<char>(name.size()) + name,
        &response);
    if (name == "loraplex.v1.NoSuchService") {
      EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
      continue;
    }
    ASSERT_TRUE(status.ok()) << name << ": " << status.error_message();
    EXPECT_EQ(response, std::string("\x08\x01", 2)) << name;
  }
  EXPECT_TRUE(server->Stop().ok()) << server->Log();
}

TEST(ServiceReflectionTest, ListsTheLoraplexServices) {
  auto server = StartServer(FreshTestDir("state"), 1);
  ASSERT_NE(server, nullptr);
  auto channel = grpc::CreateChannel(server->address(),
                                     grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue queue;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  auto call = stub.PrepareCall(
      &context,
      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &queue);
  ASSERT_NE(call, nullptr);
  // Runs one asynchronous step and waits for it.
  auto await = [&](int tag) {
    void* got = nullptr;
    bool ok = false;
    EXPECT_TRUE(queue.Next(&got, &ok));
    EXPECT_EQ(got, reinterpret_cast<void*>(static_cast<intptr_t>(tag)));
    return ok;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(await(1));
  // ServerReflectionRequest{list_services: ""}: field 7, length 0.
  grpc::Slice list_services(std::string("\x3a\x00", 2));
  grpc::ByteBuffer request(&list_services, 1);
  call->Write(request, reinterpret_cast<void*>(2));
  ASSERT_TRUE(await(2));
  call->WritesDone(reinterpret_cast<void*>(3));
  ASSERT_TRUE(await(3));
  grpc::ByteBuffer response;
  call->Read(&response, reinterpret_cast<void*>(4));
  ASSERT_TRUE(await(4));
  const std::string bytes = Bytes(response);
  for (const char* service :
       {"loraplex.v1.DatasetService", "loraplex.v1.JobService",
        "loraplex.v1.AdapterService", "loraplex.v1.ServerService",
        "loraplex.v1.SamplingService", "grpc.health.v1.Health"}) {
    EXPECT_THAT(bytes, HasSubstr(service));
  }
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  await(5);
  EXPECT_TRUE(status.ok()) << status.error_message();
  queue.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (queue.Next(&tag, &ok)) {
  }
  EXPECT_TRUE(server->Stop().ok()) << server->Log();
}

TEST(ServiceTlsTest, ServesTlsToClientsThatTrustItsCertificate) {
  const std::string state = FreshTestDir("state");
  const absl::Status certificate = MakeLoopbackCertificate(state);
  ASSERT_TRUE(certificate.ok()) << certificate;
  auto server = StartServer(
      state, 1,
      {"--tls-cert", state + "/cert.pem", "--tls-key", state + "/key.pem"});
  ASSERT_NE(server, nullptr);
  ClientOptions options;
  options.address = server->address();
  options.tls_ca_file = state + "/cert.pem";
  auto trusting = LoraplexClient::Connect(options);
  ASSERT_TRUE(trusting.ok()) << trusting.status();
  auto info = (*trusting)->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->base_model().name(), "tiny");

  options.tls_ca_file.clear();
  options.timeout = absl::Seconds(5);
  auto plaintext = LoraplexClient::Connect(options);
  ASSERT_TRUE(plaintext.ok());
  EXPECT_EQ((*plaintext)->GetServerInfo().status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_TRUE(server->Stop().ok()) << server->Log();
}

}  // namespace
}  // namespace loraplex
