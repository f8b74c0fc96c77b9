#include "server/status_mapping.h"

namespace inferd {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl and gRPC share the canonical code numbering.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

v1::FinishReason ToProto(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return v1::FINISH_REASON_UNSPECIFIED;
    case FinishReason::kLength:
      return v1::LENGTH;
    case FinishReason::kEos:
      return v1::EOS;
    case FinishReason::kStopString:
      return v1::STOP_STRING;
    case FinishReason::kStopToken:
      return v1::STOP_TOKEN;
    case FinishReason::kAborted:
      return v1::ABORTED;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

absl::Status ModelLoadingStatus() {
  return absl::UnavailableError("the model is still loading");
}

absl::Status WorkersFullStatus() {
  return absl::ResourceExhaustedError("too many requests are being prepared (tokenized) at once; retry later");
}

absl::Status CallCancelledStatus(const char* why) {
  return absl::CancelledError(why);
}

}  // namespace inferd
