#include "loader/file_reader.h"

#include "loader/pread_reader.h"
#include "loader/uring_reader.h"

namespace ckpt::loader {

const char* ReadEngineName(ReadEngine engine) { return engine == ReadEngine::kUring ? "io_uring" : "pread"; }

Result<ReadEngine> ParseReadEngine(const std::string& name) {
  if (name == "pread") return ReadEngine::kPread;
  if (name == "io_uring" || name == "uring") return ReadEngine::kUring;
  return InvalidArgument("unknown read engine '" + name + "' (pread or io_uring)");
}

Result<std::unique_ptr<FileReader>> FileReader::Create(ReadEngine engine, const ReaderOptions& options) {
  if (engine == ReadEngine::kUring) {
    CKPT_ASSIGN_OR_RETURN(auto r, UringReader::Create(options));
    return std::unique_ptr<FileReader>(std::move(r));
  }
  CKPT_ASSIGN_OR_RETURN(auto r, PreadReader::Create(options));
  return std::unique_ptr<FileReader>(std::move(r));
}

}  // namespace ckpt::loader
