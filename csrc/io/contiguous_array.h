// Arrays stored uncompressed in one contiguous byte range of a file (HDF5
// contiguous layout): read with pread, in parallel, without any library lock.
#pragma once

#include <memory>

#include "io/array.h"
#include "io/file.h"

namespace torch_shards::io {

class ContiguousArray : public Array {
 public:
  ContiguousArray(ArrayInfo info, std::shared_ptr<const File> file, int64_t offset);
  void open_files(std::vector<const File*>& files) const override { files.push_back(file_.get()); }
  void opened_stamps(FileStamps& stamps) const override { stamps[file_->path()] = file_->stamp().digest(); }
  bool remote() const override { return file_->remote(); }

 protected:
  void read_raw(const std::vector<Segment>& segments, uint8_t* out, core::ThreadPool& pool) const override;
  bool find_raw_in_place(int64_t source, int64_t length, std::vector<InPlace>& pieces) const override;

 private:
  std::shared_ptr<const File> file_;
  int64_t offset_;
};

}  // namespace torch_shards::io
