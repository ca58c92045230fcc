// LD_PRELOAD library: torch's gloo worker threads (named pt_gloo_runloop)
// are held up where a loaded machine deschedules them, so the teardown race
// of torch_only.py and tests/test_gloo_teardown.py happens in most runs
// instead of rarely. Nothing else changes: other threads, and gloo threads
// when neither variable is set, run as they would.
//
//   GLOO_STALL_NOTIFY_US  after a gloo worker thread wakes the threads waiting
//                         on a collective (pthread_cond_broadcast), it sleeps:
//                         the waiter runs on and drops its references first.
//   GLOO_STALL_GIL_US     before a gloo worker thread takes the Python GIL
//                         (PyEval_AcquireThread, what pybind11's
//                         gil_scoped_acquire calls), it sleeps.
//
// Build: cc -shared -fPIC -O2 -o libstall_gloo.so stall_gloo.c -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

static void stall_gloo_thread(const char* variable) {
  const char* microseconds = getenv(variable);
  if (microseconds == NULL) return;
  char name[17] = {0};
  prctl(PR_GET_NAME, name);
  if (strcmp(name, "pt_gloo_runloop") == 0) usleep((useconds_t)atol(microseconds));
}

int pthread_cond_broadcast(pthread_cond_t* condition) {
  static int (*real)(pthread_cond_t*);
  if (real == NULL) real = (int (*)(pthread_cond_t*))dlsym(RTLD_NEXT, "pthread_cond_broadcast");
  const int result = real(condition);
  stall_gloo_thread("GLOO_STALL_NOTIFY_US");
  return result;
}

void PyEval_AcquireThread(void* thread_state) {
  static void (*real)(void*);
  if (real == NULL) real = (void (*)(void*))dlsym(RTLD_NEXT, "PyEval_AcquireThread");
  stall_gloo_thread("GLOO_STALL_GIL_US");
  real(thread_state);
}
