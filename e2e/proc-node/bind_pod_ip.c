/*
 * LD_PRELOAD shim for the e2e process node: a process that binds the
 * wildcard address (0.0.0.0) binds its pod's IP instead ($NEREID_POD_IP),
 * so several pods on one host can each listen on, say, port 8000, the way
 * each real pod has its own network namespace. Everything else passes
 * through unchanged. Built by e2e/cluster.sh with the system's cc.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    static int (*real_bind)(int, const struct sockaddr *, socklen_t);
    if (!real_bind) {
        real_bind = (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "bind");
    }
    const char *pod_ip = getenv("NEREID_POD_IP");
    if (pod_ip && addr && addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)addr;
        if (in->sin_addr.s_addr == htonl(INADDR_ANY)) {
            struct sockaddr_in pod = *in;
            if (inet_pton(AF_INET, pod_ip, &pod.sin_addr) == 1) {
                return real_bind(fd, (const struct sockaddr *)&pod, sizeof pod);
            }
        }
    }
    return real_bind(fd, addr, len);
}
