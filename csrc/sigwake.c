/* A signal's wake-up for a watcher thread (sigwake.h). */
#include "sigwake.h"   /* first: Python.h sets the feature macros */

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SIGWAKE_MAX 65

static struct sigaction g_prev[SIGWAKE_MAX];   /* CPython's handler, run after the write (set before ours is) */
/* the pipe and its identity; g_pid last written, first read: a handler in another process writes nothing */
static volatile int g_fd = -1;
static volatile dev_t g_dev;
static volatile ino_t g_ino;
static volatile pid_t g_pid = 0;

static void wake_handler(int signum, siginfo_t *info, void *uctx) {
    int saved = errno;
    pid_t pid = g_pid;
    int fd = g_fd;
    struct stat st;
    if (pid && pid == getpid() && fd >= 0 && fstat(fd, &st) == 0 && st.st_dev == g_dev && st.st_ino == g_ino) {
        unsigned char b = (unsigned char)signum;
        ssize_t n = write(fd, &b, 1);   /* a full pipe: the watcher has bytes to read already */
        (void)n;
    }
    errno = saved;
    struct sigaction *p = &g_prev[signum];   /* installed only for a signal whose g_prev is set */
    if (p->sa_flags & SA_SIGINFO) {
        if (p->sa_sigaction) p->sa_sigaction(signum, info, uctx);
    } else if (p->sa_handler != SIG_DFL && p->sa_handler != SIG_IGN) {
        p->sa_handler(signum);
    }
}

static int set_fd(int fd) {
    struct stat st;
    if (fstat(fd, &st) != 0) return -1;
    g_pid = 0;
    g_fd = fd, g_dev = st.st_dev, g_ino = st.st_ino;
    g_pid = getpid();
    return 0;
}

PyObject *mod_sigwake_fd(PyObject *m, PyObject *arg) {
    int fd = PyLong_AsLong(arg);
    if (fd == -1 && PyErr_Occurred()) return NULL;
    if (set_fd(fd) < 0) return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

PyObject *mod_sigwake_chain(PyObject *m, PyObject *args) {
    int signum, fd;
    if (!PyArg_ParseTuple(args, "ii", &signum, &fd)) return NULL;
    if (signum <= 0 || signum >= SIGWAKE_MAX)
        return PyErr_Format(PyExc_ValueError, "sigwake_chain: signal %d is not between 1 and %d", signum, SIGWAKE_MAX - 1);
    struct sigaction cur, ours;
    if (sigaction(signum, NULL, &cur) != 0) return PyErr_SetFromErrno(PyExc_OSError);
    if (cur.sa_flags & SA_SIGINFO ? cur.sa_sigaction == wake_handler : cur.sa_handler == SIG_DFL || cur.sa_handler == SIG_IGN)
        Py_RETURN_FALSE;   /* ours already, or no handler of CPython's to run after the write */
    if (set_fd(fd) < 0) return PyErr_SetFromErrno(PyExc_OSError);
    memset(&ours, 0, sizeof(ours));
    ours.sa_sigaction = wake_handler;
    ours.sa_mask = cur.sa_mask;
    ours.sa_flags = (cur.sa_flags | SA_SIGINFO) & ~SA_RESETHAND;
    g_prev[signum] = cur;   /* ours is not in place for signum now: no handler reads it meanwhile */
    if (sigaction(signum, &ours, NULL) != 0) return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_TRUE;
}
