// What any gRPC server is expected to offer: TLS, health checking and
// reflection (what grpcurl uses). Health and reflection are spoken as raw
// protobuf bytes since their .proto files are not installed.
#include <gmock/gmock.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/client_unary_call.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/common/test_dir.h"
#include "tests/common/tls_files.h"
#include "tests/server/service_fixture.h"

namespace loraplex {
namespace {

using ::testing::HasSubstr;

std::string Bytes(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return bytes;
}

// One grpc.health.v1.Health/Check call with the encoded request `body`;
// the encoded response in *response.
grpc::Status HealthCheck(const std::shared_ptr<grpc::Channel>& channel,
                         const std::string& body, std::string* response) {
  grpc::Slice slice(body);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer answer;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  grpc::Status status =
      grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
          channel.get(),
          grpc::internal::RpcMethod("/grpc.health.v1.Health/Check",
                                    grpc::internal::RpcMethod::NORMAL_RPC),
          &context, request, &answer);
  if (status.ok()) *response = Bytes(answer);
  return status;
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
