// PreadReader: a FileReader whose threads each do one blocking pread at a time.
#pragma once

#include <memory>

#include "loader/file_reader.h"

namespace ckpt::loader {

class PreadReader : public FileReader {
 public:
  // InvalidArgument if threads < 1 or chunk_bytes is not a positive multiple of 4096.
  static Result<std::unique_ptr<PreadReader>> Create(const ReaderOptions& options);
  Status ReadAll(const std::vector<SourceFile>& files, const std::vector<ReadOp>& ops,
                 const std::function<void(size_t)>& on_done, const std::function<void()>& tick) override;
  std::string Describe() const override;

 private:
  explicit PreadReader(const ReaderOptions& options) : options_(options) {}
  ReaderOptions options_;
};

}  // namespace ckpt::loader
