// torch.classes.torch_shards.ZarrDeviceDecoder: rows of one zarr array, or of
// one CSR matrix group (AnnData's X of a zarr store, an annbatch dataset's),
// read with their chunks decoded on a device (issue 49, the reader of the
// decode_on="device" path): the host fetches the compressed chunks and plans
// the fetch (io/decode_plan), the device decompresses and assembles the rows
// (device_decode.h). A CSR matrix's indptr is read on the host; its indices
// and values are decoded on the device into a torch.sparse_csr_tensor there.
// On the CPU the same steps run with the CPU codecs.
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>
#include <torch/custom_class.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "io/csr_matrix.h"
#include "io/decode_plan/decode_plan.h"
#include "io/decode_plan/nvcomp_library.h"
#include "loader/device_decode.h"

namespace torch_shards {

class ZarrDeviceDecoderImpl : public torch::CustomClassHolder {
 public:
  // The array or CSR group (encoding-type csr_matrix) `path` of the zarr
  // store `store` (v2, v3, v3 shards). nvCOMP is looked for under
  // `nvcomp_dirs` (site-packages folders) at the first read on a CUDA device.
  // trust_unverified: DecodePlanner::trust_unverified (zstd and deflate streams without a checksum go to the
  // device too).
  ZarrDeviceDecoderImpl(const std::string& store, const std::string& path, std::vector<std::string> nvcomp_dirs,
                        int64_t num_threads, bool trust_unverified);

  // Rows `rows` (1-D int64, any order, repeats allowed) on `device` ("cpu",
  // "cuda", "cuda:N"): an array's as a tensor [len(rows), *shape[1:]] of its
  // dtype; a CSR matrix's as a sparse CSR tensor [len(rows), columns]
  // (int32 indices where the stored ones fit, else int64). On CUDA the work
  // runs on a stream of this decoder's own (decoders on several threads
  // overlap on the GPU), finished before read returns; the result is ready
  // for the caller's current stream.
  at::Tensor read(const at::Tensor& rows, const std::string& device);

  // Several batches' rows read as one (their chunks fetched and decoded once, as a dataset's fetch of
  // several batches reads them): one tensor per batch, as read() would give it, views of one read's
  // output (a CSR batch's row pointer is its own).
  std::vector<at::Tensor> read_batches(const std::vector<at::Tensor>& batches, const std::string& device);

  // Of the last read: pieces, uploaded_bytes (compressed bytes and host-decoded chunks to the
  // device), operations (device operations launched), host_chunks, chunks and input_bytes (fetched);
  // plan_us (fetching and planning on the host; fetch_us of it fetching, check_us checking the chunks), prepare_us,
  // enqueue_us and wait_us (DeviceDecodeStats).
  c10::Dict<std::string, int64_t> stats() const;

  // Why every chunk is decoded on the host ("" when the device decodes them).
  std::string fallback_reason() const;

  // Why the last read decoded chunks on the host ("" when it decoded none there): the first reason.
  std::string host_reason() const;

  // The nvCOMP library's file and version ("" before the first CUDA read).
  std::string nvcomp_library() const;

 private:
  // One read's output and, for a CSR matrix, its row pointer on the host.
  struct Read {
    at::Tensor out;
    std::vector<int64_t> row_offsets;
  };
  static std::vector<int64_t> checked_rows(const at::Tensor& rows, const char* who);
  Read read_on(const std::vector<int64_t>& rows, const std::string& device, const char* who);
  const io::decode_plan::NvcompLibrary* nvcomp_for(const c10::Device& device);
  at::Tensor read_dense(const std::vector<int64_t>& rows, const c10::Device& device);
  Read read_csr(const std::vector<int64_t>& rows, const c10::Device& device);
  // Decodes the plan into a new 1-D tensor of `type` on `device`, its stats added to stats_.
  at::Tensor decode(const io::decode_plan::DecodePlan& plan, at::ScalarType type, const c10::Device& device);

  std::string where_;
  std::optional<io::decode_plan::DecodePlanner> dense_;
  std::shared_ptr<const io::CsrMatrix> csr_;
  std::optional<io::decode_plan::DecodePlanner> indices_, values_;
  std::vector<std::string> nvcomp_dirs_;
  std::unique_ptr<core::ThreadPool> pool_;
  std::optional<io::decode_plan::NvcompLibrary> nvcomp_;
  std::optional<c10::Stream> stream_;  // the decoder's CUDA stream, from torch's pool
  mutable std::mutex mutex_;
  DeviceDecodeStats stats_;
  int64_t chunks_ = 0, input_bytes_ = 0, plan_us_ = 0, fetch_us_ = 0, check_us_ = 0;
  std::string host_reason_;
};

}  // namespace torch_shards
