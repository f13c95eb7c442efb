// The function PyTorch's CUDAPluggableAllocator calls to allocate, when our cache is PyTorch's:
// it calls the C core's entry point (jupyter_gpumem_torch_alloc, csrc/torch.c) and, where that
// returns NULL, throws (Note [The shim reads the error] in torch.c). PyTorch does not check the
// pointer its allocator returns; an exception is what it expects of an allocator that fails.
//
// Two builds of this one file (engine/_build_shim.py):
// - with JG_SHIM_C10 (compiled against the installed PyTorch's headers, linked to its libc10):
//   out of memory throws c10::OutOfMemoryError, which PyTorch raises as torch.OutOfMemoryError
//   (and which its own code catches where it retries, as cuDNN's workspace search does); any
//   other failure throws c10::Error (a RuntimeError in Python);
// - without (built with the package, needs no PyTorch): std::runtime_error, which PyTorch raises
//   as RuntimeError with the same message.
// The core's functions come in through jupyter_gpumem_shim_init, as addresses: the shim links
// nothing of ours and holds no state but those two pointers.
#include <cstddef>
#include <string>

#ifdef JG_SHIM_C10
#include <c10/util/Exception.h>
#define JG_SHIM_KIND "c10"
#else
#include <stdexcept>
#define JG_SHIM_KIND "std"
#endif

#define JG_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using AllocFn = void *(*)(std::ptrdiff_t size, int device, void *stream);
using ErrorFn = const char *(*)(int *is_oom);

AllocFn core_alloc = nullptr;
ErrorFn core_error = nullptr;

[[noreturn]] void fail(const char *text, bool out_of_memory) {
    std::string message = (text && *text) ? text : "jupyter_gpumem: allocation failed";
#ifdef JG_SHIM_C10
    const c10::SourceLocation where{__func__, __FILE__, static_cast<uint32_t>(__LINE__)};
    if (out_of_memory) throw c10::OutOfMemoryError(where, std::move(message));
    throw c10::Error(where, std::move(message));
#else
    (void)out_of_memory;
    throw std::runtime_error(message);
#endif
}

}  // namespace

// Hand the shim the core's alloc and error functions (torch_entry_points()[0] and
// torch_error_entry()); 0 on success, -1 when one is missing.
JG_EXPORT int jupyter_gpumem_shim_init(void *alloc, void *error) {
    if (!alloc || !error) return -1;
    core_alloc = reinterpret_cast<AllocFn>(alloc);
    core_error = reinterpret_cast<ErrorFn>(error);
    return 0;
}

// "c10" or "std": which exceptions this build throws.
JG_EXPORT const char *jupyter_gpumem_shim_kind(void) { return JG_SHIM_KIND; }

// What PyTorch calls: alloc(size, device, stream). A request of 0 bytes gets NULL, as from the
// core, without an error (PyTorch gives an empty tensor no memory and does not ask).
JG_EXPORT void *jupyter_gpumem_shim_alloc(std::size_t size, int device, void *stream) {
    if (!core_alloc) fail("jupyter_gpumem: the allocator shim was never initialised", false);
    void *p = core_alloc(static_cast<std::ptrdiff_t>(size), device, stream);
    if (p || size == 0) return p;
    int is_oom = 0;
    const char *text = core_error(&is_oom);
    fail(text, is_oom != 0);
}
