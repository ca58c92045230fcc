#include "io/hdf5_remote_driver.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "core/errors.h"
#include "io/file.h"
#include "io/hdf5_library.h"
#include "io/storage/url.h"

namespace torch_shards::io {

namespace {

// What HDF5 holds per open file: its public part first, as the library requires.
struct DriverFile {
  H5FD_t pub;
  std::shared_ptr<const File> file;  // small reads served from pages kept per process (File::Access::kMetadata)
  haddr_t eoa = 0;
  std::string url;
};

void push_error(const char* message) {
  H5Epush2(H5E_DEFAULT, __FILE__, "torch_shards_url_driver", __LINE__, H5E_ERR_CLS, H5E_VFL, H5E_READERROR, "%s",
           message);
}

H5FD_t* driver_open(const char* name, unsigned flags, hid_t /*fapl*/, haddr_t /*maxaddr*/) {
  if ((flags & (H5F_ACC_RDWR | H5F_ACC_TRUNC | H5F_ACC_CREAT)) != 0) {
    push_error("files behind URLs are read-only");
    return nullptr;
  }
  try {
    auto opened = std::make_shared<const File>(name, File::Access::kMetadata);
    auto* file = new DriverFile();
    std::memset(&file->pub, 0, sizeof(file->pub));
    file->file = std::move(opened);
    file->url = name;
    return &file->pub;
  } catch (const std::exception& error) {
    push_error(error.what());
    return nullptr;
  }
}

herr_t driver_close(H5FD_t* pub) {
  delete reinterpret_cast<DriverFile*>(pub);
  return 0;
}

int driver_compare(const H5FD_t* a, const H5FD_t* b) {
  return reinterpret_cast<const DriverFile*>(a)->url.compare(reinterpret_cast<const DriverFile*>(b)->url);
}

herr_t driver_query(const H5FD_t* /*file*/, unsigned long* flags) {
  *flags = 0;
  return 0;
}

haddr_t driver_get_eoa(const H5FD_t* pub, H5FD_mem_t /*type*/) { return reinterpret_cast<const DriverFile*>(pub)->eoa; }

herr_t driver_set_eoa(H5FD_t* pub, H5FD_mem_t /*type*/, haddr_t address) {
  reinterpret_cast<DriverFile*>(pub)->eoa = address;
  return 0;
}

haddr_t driver_get_eof(const H5FD_t* pub, H5FD_mem_t /*type*/) {
  return static_cast<haddr_t>(reinterpret_cast<const DriverFile*>(pub)->file->size());
}

herr_t driver_read(H5FD_t* pub, H5FD_mem_t /*type*/, hid_t /*dxpl*/, haddr_t address, size_t size, void* buffer) {
  const File& file = *reinterpret_cast<DriverFile*>(pub)->file;
  const int64_t begin = static_cast<int64_t>(address), end = begin + static_cast<int64_t>(size);
  auto* out = static_cast<uint8_t*>(buffer);
  // HDF5 reads past the end of the file as zeros (the sec2 driver does the same).
  const int64_t readable_end = std::min(end, file.size());
  if (readable_end < end)
    std::memset(out + std::max<int64_t>(0, readable_end - begin), 0,
                static_cast<size_t>(end - std::max(begin, readable_end)));
  if (begin >= readable_end) return 0;
  try {
    file.read_at(begin, static_cast<size_t>(readable_end - begin), out, "HDF5 metadata");
    return 0;
  } catch (const std::exception& error) {
    push_error(error.what());
    return -1;
  }
}

herr_t driver_write(H5FD_t* /*file*/, H5FD_mem_t /*type*/, hid_t /*dxpl*/, haddr_t /*address*/, size_t /*size*/,
                    const void* /*buffer*/) {
  push_error("files behind URLs are read-only");
  return -1;
}

herr_t driver_truncate(H5FD_t* /*file*/, hid_t /*dxpl*/, hbool_t /*closing*/) { return 0; }
herr_t driver_lock(H5FD_t* /*file*/, hbool_t /*rw*/) { return 0; }
herr_t driver_unlock(H5FD_t* /*file*/) { return 0; }

H5FD_class_t make_driver_class() {
  H5FD_class_t driver;
  std::memset(&driver, 0, sizeof(driver));
#if H5_VERSION_GE(1, 14, 0)
  driver.version = H5FD_CLASS_VERSION;
  driver.value = static_cast<H5FD_class_value_t>(700);  // in the range HDF5 leaves to drivers of users
#endif
  driver.name = "torch_shards_url";
  driver.maxaddr = static_cast<haddr_t>(INT64_MAX);
  driver.fc_degree = H5F_CLOSE_WEAK;
  driver.open = driver_open;
  driver.close = driver_close;
  driver.cmp = driver_compare;
  driver.query = driver_query;
  driver.get_eoa = driver_get_eoa;
  driver.set_eoa = driver_set_eoa;
  driver.get_eof = driver_get_eof;
  driver.read = driver_read;
  driver.write = driver_write;
  driver.truncate = driver_truncate;
  driver.lock = driver_lock;
  driver.unlock = driver_unlock;
  const H5FD_mem_t map[] = H5FD_FLMAP_DICHOTOMY;
  std::copy(std::begin(map), std::end(map), driver.fl_map);
  return driver;
}

hid_t driver_id() {
  static const H5FD_class_t driver = make_driver_class();
  static const hid_t id = H5FDregister(&driver);
  if (id < 0) throw core::ReadError("HDF5 refused the URL driver: " + hdf5_error_detail());
  return id;
}

}  // namespace

hid_t hdf5_file_access(const std::string& path) {
  if (!storage::is_url(path)) return H5P_DEFAULT;
  const hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  if (fapl < 0 || H5Pset_driver(fapl, driver_id(), nullptr) < 0) {
    if (fapl >= 0) H5Pclose(fapl);
    throw core::ReadError(path + ": cannot set up HDF5's access to it: " + hdf5_error_detail());
  }
  return fapl;
}

}  // namespace torch_shards::io
