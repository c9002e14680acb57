/*
 * LD_PRELOAD shim for the e2e process node:
 *
 * - a process that binds the wildcard address (0.0.0.0) binds its pod's IP
 *   instead ($NEREID_POD_IP), so several pods on one host can each listen
 *   on, say, port 8000, the way each real pod has its own network namespace;
 * - a name looked up with getaddrinfo that the file $NEREID_SERVICE_HOSTS
 *   lists ("<name> <ip>" lines, which the process node keeps up to date
 *   from the cluster's EndpointSlices) resolves to that address, the way
 *   the cluster's DNS resolves Service names for a real pod.
 *
 * Everything else passes through unchanged. Built by e2e/cluster.sh with
 * the system's cc.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
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

/* The address $NEREID_SERVICE_HOSTS gives `name`, copied into `ip`. */
static int service_address(const char *name, char *ip, size_t size) {
    const char *path = getenv("NEREID_SERVICE_HOSTS");
    if (!path || !name) {
        return 0;
    }
    FILE *hosts = fopen(path, "r");
    if (!hosts) {
        return 0;
    }
    char line[512];
    int found = 0;
    while (!found && fgets(line, sizeof line, hosts)) {
        char listed[256], address[64];
        if (sscanf(line, "%255s %63s", listed, address) == 2 && strcmp(listed, name) == 0
            && strlen(address) < size) {
            strcpy(ip, address);
            found = 1;
        }
    }
    fclose(hosts);
    return found;
}

int getaddrinfo(const char *node, const char *service, const struct addrinfo *hints, struct addrinfo **res) {
    static int (*real_getaddrinfo)(const char *, const char *, const struct addrinfo *, struct addrinfo **);
    if (!real_getaddrinfo) {
        real_getaddrinfo = (int (*)(const char *, const char *, const struct addrinfo *, struct addrinfo **))dlsym(
            RTLD_NEXT, "getaddrinfo");
    }
    char ip[64];
    if (service_address(node, ip, sizeof ip)) {
        /* glibc builds (and freeaddrinfo frees) the answer for the address. */
        return real_getaddrinfo(ip, service, hints, res);
    }
    return real_getaddrinfo(node, service, hints, res);
}
