/* Run under the shim, this program never calls CUDA and checks that loading the
 * shim cost nothing visible: no driver library mapped besides the shim, no
 * thread started, no device file open. Exit 0 if so; 1 with the reason if not. */
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int fail(const char* why, const char* what) {
  printf("not lazy: %s: %s\n", why, what);
  return 1;
}

int main(void) {
  /* The shim is one libcuda file; a second one mapped is a real driver. */
  char line[4096], first[4096] = "";
  FILE* maps = fopen("/proc/self/maps", "r");
  while (maps && fgets(line, sizeof line, maps)) {
    const char* path = strchr(line, '/');
    const char* base = path ? strrchr(path, '/') + 1 : NULL;
    if (!base || strncmp(base, "libcuda.so", 10) != 0) continue;
    if (!*first) {
      snprintf(first, sizeof first, "%s", path);
    } else if (strcmp(first, path) != 0) {
      return fail("a second driver library is mapped", path);
    }
  }
  if (maps) fclose(maps);
  FILE* status = fopen("/proc/self/status", "r");
  while (status && fgets(line, sizeof line, status)) {
    if (strncmp(line, "Threads:", 8) == 0 && strcmp(line, "Threads:\t1\n") != 0) {
      return fail("threads were started", line);
    }
  }
  if (status) fclose(status);
  DIR* fds = opendir("/proc/self/fd");
  struct dirent* e;
  while (fds && (e = readdir(fds))) {
    char path[512], target[512];
    snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
    ssize_t n = readlink(path, target, sizeof target - 1);
    if (n > 0) {
      target[n] = 0;
      if (strstr(target, "/dev/nvidia")) return fail("a device file is open", target);
    }
  }
  if (fds) closedir(fds);
  printf("lazy\n");
  return 0;
}
