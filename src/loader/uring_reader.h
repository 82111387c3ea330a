// UringReader: a FileReader whose threads each own an io_uring ring and keep
// queue_depth reads in flight.
#pragma once

#include <memory>

#include "loader/file_reader.h"

namespace ckpt::loader {

class UringReader : public FileReader {
 public:
  // InvalidArgument for bad options (threads or queue_depth < 1, chunk_bytes not a
  // positive multiple of 4096); Unsupported if this kernel refuses io_uring.
  static Result<std::unique_ptr<UringReader>> Create(const ReaderOptions& options);
  Status ReadAll(const std::vector<SourceFile>& files, const std::vector<ReadOp>& ops,
                 const std::function<void(size_t)>& on_done, const std::function<void()>& tick) override;
  std::string Describe() const override;

 private:
  explicit UringReader(const ReaderOptions& options) : options_(options) {}
  ReaderOptions options_;
};

}  // namespace ckpt::loader
