// A call of any streaming gRPC method with raw bytes as its messages, which
// need not parse as the method's message, through gRPC's generic stub: for
// tests of what the server answers to malformed requests.
//
//   grpc::Status status = RawStreamingCall(
//       channel, "/loraplex.v1.JobService/WatchJob", {"\x0a\x05ab"});
#ifndef LORAPLEX_TESTS_SERVER_RAW_GRPC_CALL_H_
#define LORAPLEX_TESTS_SERVER_RAW_GRPC_CALL_H_

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace loraplex {

// Sends `messages` on one call of `method`, half-closes, reads every answer
// (the final status comes after them) and returns the call's status.
inline grpc::Status RawStreamingCall(
    const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
    const std::vector<std::string>& messages, int deadline_seconds = 30) {
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue queue;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(deadline_seconds));
  auto call = stub.PrepareCall(&context, method, &queue);
  intptr_t tag = 1;
  // Waits for the operation just started; whether it succeeded.
  auto await = [&]() {
    void* got = nullptr;
    bool ok = false;
    EXPECT_TRUE(queue.Next(&got, &ok));
    EXPECT_EQ(reinterpret_cast<intptr_t>(got), tag);
    ++tag;
    return ok;
  };
  call->StartCall(reinterpret_cast<void*>(tag));
  bool open = await();
  for (const std::string& bytes : messages) {
    if (!open) break;
    grpc::Slice slice(bytes);
    grpc::ByteBuffer buffer(&slice, 1);
    call->Write(buffer, reinterpret_cast<void*>(tag));
    open = await();
  }
  if (open) {
    call->WritesDone(reinterpret_cast<void*>(tag));
    await();
  }
  grpc::ByteBuffer answer;
  for (bool reading = true; reading;) {
    call->Read(&answer, reinterpret_cast<void*>(tag));
    reading = await();
  }
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(tag));
  await();
  queue.Shutdown();
  void* ignored_tag = nullptr;
  bool ignored_ok = false;
  while (queue.Next(&ignored_tag, &ignored_ok)) {
  }
  return status;
}

}  // namespace loraplex

#endif  // LORAPLEX_TESTS_SERVER_RAW_GRPC_CALL_H_
