/* LD_PRELOADed into a load-matrix child (aoti_load_matrix.py --fault-report; compiled on the device
 * at run time with `cc -shared -fPIC`, gdb being absent there): on a fatal signal it prints the
 * faulting library and the offset in it (symbolise off the device with
 * `addr2line -f -e LIBRARY OFFSET` against the same wheel) and a backtrace to stderr, then dies of
 * the same signal, so the parent still reads how the child ended. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>

static void say(const char *text) { (void)!write(2, text, strlen(text)); }

static void report(int sig, siginfo_t *info, void *context) {
    void *pc = 0;
#if defined(__x86_64__)
    pc = (void *)((ucontext_t *)context)->uc_mcontext.gregs[REG_RIP];
#elif defined(__aarch64__)
    pc = (void *)((ucontext_t *)context)->uc_mcontext.pc;
#endif
    char line[1024];
    Dl_info where;
    if (pc && dladdr(pc, &where) && where.dli_fname) {
        snprintf(line, sizeof line, "FAULT %s at pc %p in %s+0x%lx (%s), address %p\n", strsignal(sig), pc,
                 where.dli_fname, (unsigned long)((char *)pc - (char *)where.dli_fbase),
                 where.dli_sname ? where.dli_sname : "?", info->si_addr);
    } else {
        snprintf(line, sizeof line, "FAULT %s at pc %p (in no loaded library), address %p\n", strsignal(sig), pc,
                 info->si_addr);
    }
    say(line);
    void *frames[64];
    int n = backtrace(frames, 64);
    say("FAULT backtrace:\n");
    backtrace_symbols_fd(frames, n, 2);
    signal(sig, SIG_DFL);
    raise(sig);
}

__attribute__((constructor)) static void install(void) {
    void *warm[1];
    backtrace(warm, 1); /* loads the unwinder now, not inside the handler */
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = report;
    action.sa_flags = SA_SIGINFO | SA_RESETHAND;
    sigemptyset(&action.sa_mask);
    const int fatal[] = {SIGSEGV, SIGILL, SIGBUS, SIGFPE, SIGABRT};
    for (unsigned i = 0; i < sizeof fatal / sizeof *fatal; i++) sigaction(fatal[i], &action, 0);
}
