/*
 * delayline: a constant one-way delay for the packets of one NFQUEUE queue.
 *
 * Built and started by make_netlab.py (gcc, against libnetfilter_queue and libmnl; Debian:
 * apt-get install -y iptables libnetfilter-queue-dev libmnl-dev), one instance per rank
 * network namespace, behind an iptables-legacy rule in that namespace:
 *
 *     iptables-legacy -t mangle -A PREROUTING -i veth0 -j NFQUEUE --queue-num N
 *
 * Every packet the rule queues is held for D microseconds, then accepted (NF_ACCEPT). netem
 * is not in this kernel; this is its replacement for a fixed delay.
 *
 * Timing. A packet's hold starts at the kernel's receive timestamp of it (NFQA_TIMESTAMP;
 * this program enables kernel receive timestamps by holding a socket with SO_TIMESTAMPNS
 * open, a machine-wide switch), converted to CLOCK_MONOTONIC; a packet without one starts
 * when this program reads it. So the wake-up latency of this program does not lengthen the
 * hold. Releases are scheduled on CLOCK_MONOTONIC with ppoll() (timer slack 1 ns). This
 * machine (a VM) wakes a sleeping thread some 25-50 us after its timer expires, so the timer
 * is set that much early (a running average of the observed overshoot, plus a margin) and
 * the rest of the wait is spun (reading the queue meanwhile), at most 210 us at a time.
 * The kernel stamps a packet when veth0 receives it, before the PREROUTING hook: on an idle
 * machine a few us earlier; under CPU contention the receive processing in between can lag,
 * and such lag (read_lag_us) is then part of D rather than added to it.
 * The program asks for SCHED_FIFO priority 10 (falls back to the normal scheduler) so the
 * ranks' computation does not delay it. The statistics give the achieved lateness.
 *
 * Order. Since D is constant, packets leave in the order they came: the held packets are a
 * FIFO (a ring of packet ids and release times), and all packets due at one wake-up are
 * released with one batch verdict (NFQNL_MSG_VERDICT_BATCH accepts every queued packet with
 * an id up to the given one; ids grow in arrival order). The queue is configured with
 * NFQA_CFG_F_GSO, so the kernel hands over GSO super-packets whole instead of segmenting
 * them first, and copies 1 byte of each packet (NFQA_CAP_LEN then gives its length).
 *
 * No drops. The kernel queue's maxlen is large (default 65536 packets; when it is full the
 * kernel drops, it does not fail open), the netlink socket's receive buffer is large
 * (default 64 MiB, SO_RCVBUFFORCE), and every ENOBUFS (the kernel could not deliver a packet
 * to this socket and dropped it) is counted. The kernel's own counters are in
 * /proc/net/netfilter/nfnetlink_queue of the namespace (queue_dropped, user_dropped).
 *
 * Usage: delayline QUEUE_NUM DELAY_US [MAXLEN [RCVBUF_BYTES]]
 *
 * Prints "ready ..." on stdout once the queue is bound (add the iptables rule after that).
 * On SIGTERM or SIGINT it releases whatever it still holds, prints one JSON line of
 * statistics on stdout and exits 0. Exit status 1 on a setup or socket error (message on
 * stderr), 2 on bad arguments.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <libmnl/libmnl.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_queue.h>
#include <libnetfilter_queue/libnetfilter_queue.h>

#define WAKE_MARGIN_NS 10000        /* wake this much earlier than the average overshoot */
#define OVERSHOOT_MAX_NS 200000     /* so never spin longer than 210 us at once */

struct held {
    uint32_t id;      /* the kernel's packet id */
    int64_t due_ns;   /* CLOCK_MONOTONIC time to release it */
};

static struct held *fifo;
static size_t cap, head, count;

static struct mnl_socket *nl;
static unsigned int portid;
static uint32_t queue_num;
static int64_t delay_ns;
static int64_t overshoot_ns = 30000;  /* running average of the timer wake-up overshoot */

/* statistics */
static uint64_t packets, bytes, batches, enobufs, max_held, overflow, netlink_errors;
static uint64_t kernel_stamped, released_due, late_over_100us, early;
static int64_t lateness_sum_ns, lateness_max_ns, stamp_age_sum_ns, stamp_age_max_ns, spin_ns;

static volatile sig_atomic_t stop;

static void on_signal(int sig) { (void)sig; stop = 1; }

static int64_t clock_ns(clockid_t clk)
{
    struct timespec ts;
    clock_gettime(clk, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t now_ns(void) { return clock_ns(CLOCK_MONOTONIC); }

static void die(const char *what)
{
    fprintf(stderr, "delayline queue %u: %s: %s\n", queue_num, what, strerror(errno));
    exit(1);
}

/* Send one configuration message and wait for the kernel's ack (or error). */
static void config(struct nlmsghdr *nlh, const char *what)
{
    char buf[MNL_SOCKET_BUFFER_SIZE];
    nlh->nlmsg_flags |= NLM_F_ACK;
    nlh->nlmsg_seq = (uint32_t)now_ns();
    if (mnl_socket_sendto(nl, nlh, nlh->nlmsg_len) < 0)
        die(what);
    ssize_t n = mnl_socket_recvfrom(nl, buf, sizeof buf);
    if (n < 0 || mnl_cb_run(buf, (size_t)n, nlh->nlmsg_seq, portid, NULL, NULL) < 0)
        die(what);
}

static void setup(uint32_t maxlen, int rcvbuf)
{
    char buf[MNL_SOCKET_BUFFER_SIZE];
    struct nlmsghdr *nlh;

    /* kernel receive timestamps on (stays on while this socket is open) */
    int one = 1, ts_sock = socket(AF_INET, SOCK_DGRAM, 0);
    if (ts_sock < 0 || setsockopt(ts_sock, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof one) < 0)
        die("enable receive timestamps");

    nl = mnl_socket_open(NETLINK_NETFILTER);
    if (nl == NULL)
        die("mnl_socket_open");
    if (mnl_socket_bind(nl, 0, MNL_SOCKET_AUTOPID) < 0)
        die("mnl_socket_bind");
    portid = mnl_socket_get_portid(nl);
    int fd = mnl_socket_get_fd(nl);
    if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof rcvbuf) < 0 &&
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf) < 0)
        die("setsockopt SO_RCVBUF");

    nlh = nfq_nlmsg_put(buf, NFQNL_MSG_CONFIG, queue_num);
    nfq_nlmsg_cfg_put_cmd(nlh, AF_INET, NFQNL_CFG_CMD_BIND);
    config(nlh, "bind queue (is another program bound to it?)");

    nlh = nfq_nlmsg_put(buf, NFQNL_MSG_CONFIG, queue_num);
    nfq_nlmsg_cfg_put_params(nlh, NFQNL_COPY_PACKET, 1);
    config(nlh, "set copy mode");

    nlh = nfq_nlmsg_put(buf, NFQNL_MSG_CONFIG, queue_num);
    nfq_nlmsg_cfg_put_qmaxlen(nlh, maxlen);
    config(nlh, "set queue maxlen");

    nlh = nfq_nlmsg_put(buf, NFQNL_MSG_CONFIG, queue_num);
    mnl_attr_put_u32(nlh, NFQA_CFG_FLAGS, htonl(NFQA_CFG_F_GSO));
    mnl_attr_put_u32(nlh, NFQA_CFG_MASK, htonl(NFQA_CFG_F_GSO));
    config(nlh, "set NFQA_CFG_F_GSO");
}

/* One queued packet: remember its id and when to release it. */
static int on_packet(const struct nlmsghdr *nlh, void *data)
{
    (void)data;
    struct nlattr *attr[NFQA_MAX + 1] = {0};

    if (nfq_nlmsg_parse(nlh, attr) < 0 || attr[NFQA_PACKET_HDR] == NULL)
        return MNL_CB_OK;  /* not a packet message */
    const struct nfqnl_msg_packet_hdr *ph = mnl_attr_get_payload(attr[NFQA_PACKET_HDR]);
    int64_t mono = now_ns(), arrived = mono;
    if (attr[NFQA_TIMESTAMP]) {
        const struct nfqnl_msg_packet_timestamp *ts = mnl_attr_get_payload(attr[NFQA_TIMESTAMP]);
        int64_t stamp_real = (int64_t)be64toh(ts->sec) * 1000000000 +
                             (int64_t)be64toh(ts->usec) * 1000;
        int64_t age = clock_ns(CLOCK_REALTIME) - stamp_real;  /* how long ago it arrived */
        if (age >= 0 && age < 1000000000) {  /* plausible: use it */
            arrived = mono - age;
            kernel_stamped++;
            stamp_age_sum_ns += age;
            if (age > stamp_age_max_ns)
                stamp_age_max_ns = age;
        }
    }
    if (count == cap) {
        overflow++;  /* more held than the kernel queue can hold: not with maxlen <= cap */
        return MNL_CB_OK;
    }
    fifo[(head + count) % cap] = (struct held){ntohl(ph->packet_id), arrived + delay_ns};
    count++;
    if (count > max_held)
        max_held = count;
    packets++;
    if (attr[NFQA_CAP_LEN])
        bytes += ntohl(mnl_attr_get_u32(attr[NFQA_CAP_LEN]));
    else if (attr[NFQA_PAYLOAD])
        bytes += mnl_attr_get_payload_len(attr[NFQA_PAYLOAD]);
    return MNL_CB_OK;
}

/* Accept every queued packet with an id up to ``id`` (one netlink message). */
static void accept_upto(uint32_t id)
{
    char buf[MNL_SOCKET_BUFFER_SIZE];
    struct nlmsghdr *nlh = nfq_nlmsg_put(buf, NFQNL_MSG_VERDICT_BATCH, queue_num);
    nfq_nlmsg_verdict_put(nlh, (int)id, NF_ACCEPT);
    if (mnl_socket_sendto(nl, nlh, nlh->nlmsg_len) < 0)
        die("send verdict");
    batches++;
}

/* Release the packets that are due at ``now`` (all of them when ``all``). */
static void release(int64_t now, int all)
{
    int any = 0;
    uint32_t last = 0;
    while (count && (all || fifo[head].due_ns <= now)) {
        int64_t late = now - fifo[head].due_ns;
        if (late >= 0) {
            released_due++;
            lateness_sum_ns += late;
            if (late > lateness_max_ns)
                lateness_max_ns = late;
            if (late > 100000)
                late_over_100us++;
        } else {
            early++;  /* only at the end, when everything held is let go */
        }
        last = fifo[head].id;
        any = 1;
        head = (head + 1) % cap;
        count--;
    }
    if (any)
        accept_upto(last);
}

/* Read everything the socket holds now (non-blocking). */
static void drain(void)
{
    static char buf[1 << 16];
    for (;;) {
        ssize_t n = recv(mnl_socket_get_fd(nl), buf, sizeof buf, MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
                return;
            if (errno == ENOBUFS) {  /* the kernel dropped packet(s) for this socket */
                enobufs++;
                continue;
            }
            die("recv");
        }
        /* < 0: an NLMSG_ERROR, e.g. a verdict the kernel refused; counted, not fatal */
        if (mnl_cb_run(buf, (size_t)n, 0, portid, on_packet, NULL) < 0)
            netlink_errors++;
    }
}

int main(int argc, char **argv)
{
    if (argc < 3 || argc > 5) {
        fprintf(stderr, "usage: %s QUEUE_NUM DELAY_US [MAXLEN [RCVBUF_BYTES]]\n", argv[0]);
        return 2;
    }
    queue_num = (uint32_t)strtoul(argv[1], NULL, 10);
    delay_ns = (int64_t)(strtod(argv[2], NULL) * 1000.0);
    uint32_t maxlen = argc > 3 ? (uint32_t)strtoul(argv[3], NULL, 10) : 65536;
    int rcvbuf = argc > 4 ? atoi(argv[4]) : 64 << 20;
    if (delay_ns < 0 || maxlen == 0 || rcvbuf <= 0) {
        fprintf(stderr, "delayline: bad arguments\n");
        return 2;
    }
    cap = maxlen;
    fifo = calloc(cap, sizeof *fifo);
    if (fifo == NULL)
        die("calloc");

    /* SIGTERM/SIGINT are blocked except inside ppoll, so a stop request is never missed */
    sigset_t block, during_poll;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    sigprocmask(SIG_BLOCK, &block, &during_poll);
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    prctl(PR_SET_TIMERSLACK, 1UL);  /* wake-ups within ~1 ns of the timer, not 50 us */
    struct sched_param sp = {.sched_priority = 10};
    int fifo_sched = sched_setscheduler(0, SCHED_FIFO, &sp) == 0;

    setup(maxlen, rcvbuf);
    printf("ready queue=%u delay_us=%.3f maxlen=%u rcvbuf=%d sched=%s\n", queue_num,
           (double)delay_ns / 1e3, maxlen, rcvbuf, fifo_sched ? "fifo" : "other");
    fflush(stdout);

    struct pollfd pfd = {.fd = mnl_socket_get_fd(nl), .events = POLLIN};
    while (!stop) {
        struct timespec ts, *timeout = NULL;
        int64_t target = 0, wait = 0, early_by = overshoot_ns + WAKE_MARGIN_NS;
        if (count) {
            target = fifo[head].due_ns - early_by;
            wait = target - now_ns();
            if (wait < 0)
                wait = 0;
            ts.tv_sec = wait / 1000000000;
            ts.tv_nsec = wait % 1000000000;
            timeout = &ts;
        }
        int r = ppoll(&pfd, 1, timeout, &during_poll);
        int64_t now = now_ns();
        if (r < 0 && errno != EINTR)
            die("ppoll");
        if (r == 0 && timeout != NULL && wait > 0) {
            /* a timer wake-up: learn its overshoot (1/8 weight per sample) */
            int64_t over = now - target;
            overshoot_ns += (over - overshoot_ns) / 8;
            if (overshoot_ns < 0)
                overshoot_ns = 0;
            if (overshoot_ns > OVERSHOOT_MAX_NS)
                overshoot_ns = OVERSHOOT_MAX_NS;
        }
        if (r > 0)
            drain();
        /* spin the rest of the way to the next release if a timer could not make it */
        if (count && fifo[head].due_ns > now && fifo[head].due_ns - now <= early_by) {
            int64_t spin_from = now;
            while (!stop && fifo[head].due_ns > now) {
                drain();
                now = now_ns();
            }
            spin_ns += now - spin_from;
        }
        release(now, 0);
    }
    release(now_ns(), 1);
    printf("{\"queue\": %u, \"delay_us\": %.3f, \"sched\": \"%s\", \"packets\": %" PRIu64
           ", \"bytes\": %" PRIu64 ", \"kernel_timestamped\": %" PRIu64
           ", \"verdict_batches\": %" PRIu64 ", \"max_held\": %" PRIu64
           ", \"enobufs\": %" PRIu64 ", \"fifo_overflow\": %" PRIu64
           ", \"netlink_errors\": %" PRIu64 ", \"lateness_us_mean\": %.3f"
           ", \"lateness_us_max\": %.3f, \"late_over_100us\": %" PRIu64
           ", \"released_at_exit_early\": %" PRIu64 ", \"read_lag_us_mean\": %.3f"
           ", \"read_lag_us_max\": %.3f"
           ", \"wake_overshoot_us\": %.3f, \"spin_ms\": %.3f}\n",
           queue_num, (double)delay_ns / 1e3, fifo_sched ? "fifo" : "other", packets, bytes,
           kernel_stamped, batches, max_held, enobufs, overflow, netlink_errors,
           released_due ? (double)lateness_sum_ns / 1e3 / (double)released_due : 0.0,
           (double)lateness_max_ns / 1e3, late_over_100us, early,
           kernel_stamped ? (double)stamp_age_sum_ns / 1e3 / (double)kernel_stamped : 0.0,
           (double)stamp_age_max_ns / 1e3, (double)overshoot_ns / 1e3, (double)spin_ns / 1e6);
    fflush(stdout);
    mnl_socket_close(nl);
    return 0;
}
