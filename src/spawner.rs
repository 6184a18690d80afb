//! Starting run commands from threads whose file-descriptor table holds almost nothing.
//!
//! A spawn copies the spawning thread's descriptor table into the child, and the child closes
//! every close-on-exec descriptor when it execs: both cost time per descriptor the node holds.
//! A node holds three per run in flight (two output pipes and a pidfd), so in a burst of 2,000
//! runs it held ~3,700, and a command spawned beside 4,000 open descriptors used ~0.3 ms more CPU
//! (a shell that runs `date`: 1.66-1.82 ms alone, 2.00-2.13 ms beside them). So once many runs
//! are in flight, spawns happen on spawner threads that unshare their descriptor table at start
//! and close all of it but one socket end. Each child's output pipes cross to the node's table
//! over that socket (`SCM_RIGHTS`) and are closed on the spawner's side; a receiver thread hands
//! them to the run that asked.

use std::collections::HashMap;
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};

use rustix::net::{
    recvmsg, sendmsg, socketpair, AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags,
    SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketFlags, SocketType,
};
use rustix::process::{Pid, Signal, WaitOptions};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::net::unix::pipe;
use tokio::sync::oneshot;

/// A started command: its pid (it leads its own process group), output pipes and exit.
pub(crate) struct Child {
    pid: Pid,
    pub(crate) stdout: Option<pipe::Receiver>,
    pub(crate) stderr: Option<pipe::Receiver>,
    exit: Exit,
}

enum Exit {
    /// The child's pidfd, readable once it has exited.
    Running(AsyncFd<OwnedFd>),
    Reaped(ExitStatus),
}

impl Child {
    /// The child's pid, which is also its process group's id.
    pub(crate) fn pid(&self) -> Pid {
        self.pid
    }

    /// Waits for the child to exit and reaps it; again after that, the same status.
    pub(crate) async fn wait(&mut self) -> io::Result<ExitStatus> {
        let exit = match &self.exit {
            Exit::Running(exit) => exit,
            Exit::Reaped(status) => return Ok(*status),
        };
        loop {
            let mut ready = exit.readable().await?;
            match rustix::process::waitpid(Some(self.pid), WaitOptions::NOHANG)? {
                Some((_, status)) => {
                    let status = ExitStatus::from_raw(status.as_raw());
                    self.exit = Exit::Reaped(status);
                    return Ok(status);
                }
                None => ready.clear_ready(),
            }
        }
    }
}

impl Drop for Child {
    /// A run dropped before its command exited (its task was cancelled) kills the command's
    /// whole group, and the child is reaped in the background so no zombie stays.
    fn drop(&mut self) {
        CHILDREN.fetch_sub(1, Ordering::Relaxed);
        let Exit::Running(exit) = std::mem::replace(&mut self.exit, Exit::Reaped(ExitStatus::default())) else {
            return;
        };
        let _ = rustix::process::kill_process_group(self.pid, Signal::KILL);
        let pid = self.pid;
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    let _ = exit.readable().await;
                    let _ = rustix::process::waitpid(Some(pid), WaitOptions::empty());
                });
            }
            Err(_) => abandon(pid),
        }
    }
}

/// Children spawned and not yet dropped: the node holds three descriptors for each.
static CHILDREN: AtomicUsize = AtomicUsize::new(0);

/// With fewer children than this, a command is spawned on the calling thread. The spawner
/// threads pay off only when the node's table is large: each request crosses two threads,
/// whose wake-ups wait for a core while the children run. Burst p99 over the floor's, two runs
/// each: always inline 0.96-1.01x at 20 due at once, 1.08-1.17x at 200, 1.30-1.31x at 2,000;
/// always through the spawner threads 1.27x, 1.14-1.26x, 1.20-1.21x; with this switch 1.01-1.33x
/// (inline: noise), 1.07-1.08x, 1.08-1.11x.
const INLINE_BELOW: usize = 256;

/// Starts `command` (whose stdout and stderr must be piped) in a process group of its own, if
/// `last_check`, called right before the spawn, says it may start and finishes it; `Ok(None)`
/// if it said no. While few children run it is spawned on the calling thread; beyond that on a
/// spawner thread, where requests wait in a queue, so whatever decides whether and how a command
/// starts (the leadership, the lease's deadline) is read by `last_check` right before the spawn.
/// It may run outside the runtime: it must wake no task (no cancelling, no sending).
pub(crate) async fn spawn(
    mut command: Command,
    last_check: impl FnMut(&mut Command) -> bool + Send + 'static,
) -> io::Result<Option<Child>> {
    // A run's stop and kill signal the group, and a dropped child's group is killed.
    command.process_group(0);
    if CHILDREN.load(Ordering::Relaxed) >= INLINE_BELOW {
        if let Some(spawner) = shared_spawner().filter(|spawner| spawner.serves()) {
            return spawner.spawn(command, last_check).await;
        }
    }
    spawn_here(command, last_check)
}

/// The node's spawner threads, started on first use. Where they cannot start (a seccomp
/// profile that refuses `unshare`, a kernel without `close_range`, no thread to be had) the node
/// spawns every command on the calling thread, as it does while few children run.
fn shared_spawner() -> Option<&'static Spawner> {
    static SHARED: OnceLock<Option<Spawner>> = OnceLock::new();
    SHARED
        .get_or_init(|| {
            Spawner::start()
                .inspect_err(|err| {
                    tracing::warn!(error = %err, "the spawner threads did not start: every command is spawned on the runtime's threads, with a copy of the node's whole descriptor table");
                })
                .ok()
        })
        .as_ref()
}

fn spawn_here(mut command: Command, mut last_check: impl FnMut(&mut Command) -> bool) -> io::Result<Option<Child>> {
    if !last_check(&mut command) {
        return Ok(None);
    }
    let mut child = command.spawn()?;
    let pid = Pid::from_child(&child);
    match (child.stdout.take(), child.stderr.take()) {
        (Some(stdout), Some(stderr)) => adopt(pid, stdout.into(), stderr.into()).map(Some),
        _ => {
            abandon(pid);
            Err(io::Error::other("the command's output was not piped"))
        }
    }
}

/// A started child, whose pipes are in the node's table, becomes a [`Child`]; on failure it is
/// killed and reaped.
fn adopt(pid: Pid, stdout: OwnedFd, stderr: OwnedFd) -> io::Result<Child> {
    let exit = match rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())
        .map_err(io::Error::from)
        .and_then(watch_exit)
    {
        Ok(exit) => exit,
        Err(err) => {
            abandon(pid);
            return Err(err);
        }
    };
    CHILDREN.fetch_add(1, Ordering::Relaxed);
    // From here a failure drops the child, which kills and reaps it.
    let mut child = Child {
        pid,
        stdout: None,
        stderr: None,
        exit: Exit::Running(exit),
    };
    child.stdout = Some(receiver(stdout)?);
    child.stderr = Some(receiver(stderr)?);
    Ok(child)
}

fn watch_exit(pidfd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: an `OwnedFd` keeps its descriptor open and the same until it is dropped, which is
    // when the `AsyncFd` that owns it is.
    Ok(unsafe { AsyncFd::register_with_interest(pidfd, Interest::READABLE) }?)
}

fn receiver(fd: OwnedFd) -> io::Result<pipe::Receiver> {
    rustix::io::ioctl_fionbio(&fd, true)?;
    pipe::Receiver::from_owned_fd_unchecked(fd)
}

struct Spawner {
    requests: mpsc::Sender<Request>,
    /// The spawners' end of the socket in the node's table: each spawner thread uses its copy
    /// of this descriptor, in its own table.
    _sending: OwnedFd,
    /// Set once the socket between the spawner threads and the node failed: the node spawns on
    /// the calling thread from then on.
    stopped: Arc<AtomicBool>,
}

struct Request {
    command: Command,
    last_check: LastCheck,
    reply: Reply,
}

type LastCheck = Box<dyn FnMut(&mut Command) -> bool + Send>;
type Reply = oneshot::Sender<io::Result<Option<Started>>>;

/// A child on its way to its run: killed and reaped if it never arrives (a run cancelled after
/// its answer was sent and before it read it drops it unread).
struct Started(Option<(Pid, OwnedFd, OwnedFd)>);

impl Started {
    fn adopt(mut self) -> io::Result<Child> {
        match self.0.take() {
            Some((pid, stdout, stderr)) => adopt(pid, stdout, stderr),
            None => Err(io::Error::other("a started child was adopted twice")),
        }
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        if let Some((pid, _, _)) = self.0.take() {
            abandon(pid);
        }
    }
}

/// Requests a spawner thread has taken, by number, until the receiver thread answers them. The
/// spawner threads never answer or drop a request themselves: that can wake a task, and a wake
/// may write to the runtime's own descriptor, which their table does not hold.
type InFlight = Arc<Mutex<HashMap<u64, (Reply, LastCheck)>>>;

/// What a spawner thread tells the receiver thread of a request, beside a started child's two
/// descriptors: the request's number, the child's pid and one of the outcomes below (or the
/// spawn's error number).
const MESSAGE: usize = 16;
const SPAWNED: i32 = 0;
const REFUSED: i32 = -1;
const GONE: i32 = -2;

impl Spawner {
    fn start() -> io::Result<Spawner> {
        let (sending, receiving) = socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)?;
        // Not one of the standard streams, which a spawner keeps open.
        let sending = rustix::io::fcntl_dupfd_cloexec(&sending, 3)?;
        let in_flight = InFlight::default();
        let stopped = Arc::new(AtomicBool::new(false));
        let (requests, queue) = mpsc::channel::<Request>();
        let queue = Arc::new(Mutex::new(queue));
        let numbers = Arc::new(AtomicU64::new(0));
        let threads = std::thread::available_parallelism().map_or(2, usize::from);
        let (ready, readiness) = mpsc::channel();
        for index in 0..threads {
            let (queue, in_flight, numbers) = (Arc::clone(&queue), Arc::clone(&in_flight), Arc::clone(&numbers));
            let (socket, ready, stopped) = (sending.as_raw_fd(), ready.clone(), Arc::clone(&stopped));
            std::thread::Builder::new()
                .name(format!("shardcron-spawn-{index}"))
                .spawn(move || {
                    let socket = match private_table_keeping(socket) {
                        Ok(socket) => socket,
                        Err(err) => {
                            let _ = ready.send(Err(err));
                            return;
                        }
                    };
                    let _ = ready.send(Ok(()));
                    drop(ready);
                    spawn_loop(&socket, &queue, &in_flight, &numbers, &stopped);
                })?;
        }
        drop(ready);
        // Every thread has made its table its own (or failed to) before `sending` may close.
        // One that failed would serve nothing: no spawner threads at all then, rather than
        // spawns that hang in a queue.
        let made_own: Vec<io::Result<()>> = readiness.into_iter().collect();
        made_own.into_iter().collect::<io::Result<()>>()?;
        let receiver_stopped = Arc::clone(&stopped);
        std::thread::Builder::new()
            .name("shardcron-answer".to_string())
            .spawn(move || receive_loop(receiving, in_flight, &receiver_stopped))?;
        Ok(Spawner {
            requests,
            _sending: sending,
            stopped,
        })
    }

    /// Whether the spawner threads still take requests.
    fn serves(&self) -> bool {
        !self.stopped.load(Ordering::Acquire)
    }

    async fn spawn(
        &self,
        command: Command,
        last_check: impl FnMut(&mut Command) -> bool + Send + 'static,
    ) -> io::Result<Option<Child>> {
        let (reply, started) = oneshot::channel();
        self.requests
            .send(Request {
                command,
                last_check: Box::new(last_check),
                reply,
            })
            .map_err(|_| io::Error::other("the spawner threads have stopped"))?;
        let answer = started.await.map_err(|_| {
            io::Error::other("the spawner threads stopped before the command could start (they are not used again)")
        })??;
        answer.map(Started::adopt).transpose()
    }
}

/// A spawner thread, in its own descriptor table: one request at a time.
fn spawn_loop(
    socket: &OwnedFd,
    queue: &Mutex<mpsc::Receiver<Request>>,
    in_flight: &InFlight,
    numbers: &AtomicU64,
    stopped: &AtomicBool,
) {
    loop {
        let request = match queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).recv() {
            Ok(request) => request,
            Err(_) => return,
        };
        let Request {
            mut command,
            mut last_check,
            reply,
        } = request;
        let number = numbers.fetch_add(1, Ordering::Relaxed);
        if stopped.load(Ordering::Acquire) {
            // Nothing reads the socket any more: the receiver thread answers what is left in
            // flight, that nothing started.
            lock(in_flight).insert(number, (reply, last_check));
            continue;
        }
        let mut pipes = None;
        let (pid, outcome) = if reply.is_closed() {
            // A run cancelled while it waited starts nothing.
            (0, GONE)
        } else if !last_check(&mut command) {
            (0, REFUSED)
        } else {
            match command.spawn() {
                Ok(mut child) => {
                    let pid = Pid::from_child(&child).as_raw_pid();
                    match (child.stdout.take(), child.stderr.take()) {
                        (Some(stdout), Some(stderr)) => {
                            pipes = Some([OwnedFd::from(stdout), OwnedFd::from(stderr)]);
                            (pid, SPAWNED)
                        }
                        _ => (pid, libc::EINVAL),
                    }
                }
                Err(err) => (0, err.raw_os_error().unwrap_or(libc::EIO)),
            }
        };
        lock(in_flight).insert(number, (reply, last_check));
        let mut message = [0u8; MESSAGE];
        message[..8].copy_from_slice(&number.to_le_bytes());
        message[8..12].copy_from_slice(&pid.to_le_bytes());
        message[12..].copy_from_slice(&outcome.to_le_bytes());
        let sent = match &pipes {
            Some([stdout, stderr]) => {
                let fds = [stdout.as_fd(), stderr.as_fd()];
                let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
                let mut control = SendAncillaryBuffer::new(&mut space);
                control.push(SendAncillaryMessage::ScmRights(&fds));
                sendmsg(socket, &[IoSlice::new(&message)], &mut control, SendFlags::NOSIGNAL)
            }
            None => send_plain(socket, &message),
        };
        if let Err(err) = sent {
            // The pipes could not cross: the child is killed, and the request answered with the
            // error, which needs no descriptor.
            if let Some(pid) = Pid::from_raw(pid) {
                abandon(pid);
            }
            message[8..12].copy_from_slice(&0i32.to_le_bytes());
            message[12..].copy_from_slice(&err.raw_os_error().to_le_bytes());
            if let Err(err) = send_plain(socket, &message) {
                // The receiver thread reads what was sent before, then stops the spawner
                // threads and answers the rest itself.
                tracing::error!(error = %err, "the spawner socket failed: commands are spawned on the runtime's threads from now on");
                let _ = rustix::net::shutdown(socket, rustix::net::Shutdown::Write);
            }
        }
        // The pipes' descriptors close here, in this thread's table: the node's copies remain.
    }
}

fn send_plain(socket: &OwnedFd, message: &[u8; MESSAGE]) -> rustix::io::Result<usize> {
    sendmsg(
        socket,
        &[IoSlice::new(message)],
        &mut SendAncillaryBuffer::default(),
        SendFlags::NOSIGNAL,
    )
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Gives this thread a descriptor table of its own and closes every descriptor in it but the
/// standard streams and `keep`, which is returned as owned in this table.
///
/// Signals are blocked in this thread first: a signal sent to the process runs its handler on
/// any thread that does not block it, and the runtime's handler writes to a descriptor of the
/// node's table, which here would be closed or another file (a SIGTERM was lost that way). The
/// children do not inherit the mask: std's spawn empties it.
fn private_table_keeping(keep: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: `signals` is initialised by sigfillset before it is read; blocking signals in
    // this thread only moves their delivery to the node's other threads.
    let blocked = unsafe {
        let mut signals = MaybeUninit::<libc::sigset_t>::uninit();
        libc::sigfillset(signals.as_mut_ptr()) == 0
            && libc::pthread_sigmask(libc::SIG_BLOCK, signals.as_ptr(), std::ptr::null_mut()) == 0
    };
    if !blocked {
        return Err(io::Error::other("could not block signals"));
    }
    // SAFETY: from here this thread uses only descriptors it opens itself, and `keep`, which is
    // open in the copy the kernel makes; it never passes a descriptor number to another thread.
    if unsafe { libc::unshare(libc::CLONE_FILES) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let keep = keep as libc::c_uint;
    // SAFETY: the descriptors closed are this thread's copies; the node's own stay open, and
    // nothing in this thread owns any of them. `keep` is 3 or more (made so by the caller).
    let closed = unsafe {
        (keep == 3 || libc::close_range(3, keep - 1, 0) == 0) && libc::close_range(keep + 1, libc::c_uint::MAX, 0) == 0
    };
    if !closed {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `keep` is open in this thread's table, and nothing else in this thread owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(keep as RawFd) })
}

/// The node's side of the socket: each answer goes to the run that asked, with a started child's
/// pipes, now in the node's table; a child whose run is gone by then is killed.
fn receive_loop(socket: OwnedFd, in_flight: InFlight, stopped: &AtomicBool) {
    loop {
        let mut message = [0u8; MESSAGE];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let received = recvmsg(
            &socket,
            &mut [IoSliceMut::new(&mut message)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        );
        match received {
            Ok(received) if received.bytes == MESSAGE => {}
            Err(rustix::io::Errno::INTR) => continue,
            // Every message is whole (a sequenced-packet socket); anything else is its end.
            failed => {
                if let Err(err) = failed {
                    tracing::error!(error = %err, "the spawner socket failed: commands are spawned on the runtime's threads from now on");
                }
                stopped.store(true, Ordering::Release);
                drop(socket);
                answer_the_rest(&in_flight);
                return;
            }
        }
        let mut pipes: Vec<OwnedFd> = control
            .drain()
            .flat_map(|message| match message {
                RecvAncillaryMessage::ScmRights(fds) => fds.collect(),
                _ => Vec::new(),
            })
            .collect();
        let number = u64::from_le_bytes(message[..8].try_into().unwrap_or_default());
        let pid = Pid::from_raw(i32::from_le_bytes(message[8..12].try_into().unwrap_or_default()));
        let outcome = i32::from_le_bytes(message[12..].try_into().unwrap_or_default());
        let (stderr, stdout) = (pipes.pop(), pipes.pop());
        let answer = match (outcome, pid, stdout, stderr) {
            (SPAWNED, Some(pid), Some(stdout), Some(stderr)) => Ok(Some(Started(Some((pid, stdout, stderr))))),
            (SPAWNED, pid, _, _) => {
                pid.into_iter().for_each(abandon);
                Err(io::Error::other("the command's pipes did not reach the node"))
            }
            (REFUSED | GONE, _, _, _) => Ok(None),
            (errno, pid, _, _) => {
                pid.into_iter().for_each(abandon);
                Err(io::Error::from_raw_os_error(errno))
            }
        };
        // A child whose run is gone, and so no answer, is killed as its `Started` drops. The
        // answer is sent after the lock is let go: the spawner threads wait on it.
        let request = lock(&in_flight).remove(&number);
        if let Some((reply, _last_check)) = request {
            let _ = reply.send(answer);
        }
    }
}

/// Once the socket failed, answers the requests the spawner threads still take, until they have
/// all ended, by dropping them: the runs that asked learn that their commands did not start.
fn answer_the_rest(in_flight: &InFlight) {
    const EVERY: std::time::Duration = std::time::Duration::from_millis(100);
    loop {
        let left = std::mem::take(&mut *lock(in_flight));
        drop(left);
        if Arc::strong_count(in_flight) == 1 {
            return;
        }
        std::thread::sleep(EVERY);
    }
}

/// Kills the group of a child no run will own, and reaps it.
fn abandon(pid: Pid) {
    let _ = rustix::process::kill_process_group(pid, Signal::KILL);
    let _ = rustix::process::waitpid(Some(pid), WaitOptions::empty());
}

#[cfg(test)]
mod tests {
    use std::process::Stdio;
    use std::time::{Duration, Instant};

    use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

    use super::*;

    fn sh(script: &str) -> Command {
        let mut command = Command::new("sh");
        command.arg("-c");
        if !script.is_empty() {
            command.arg(script);
        }
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        command
    }

    async fn read_all(pipe: Option<pipe::Receiver>) -> String {
        let mut text = String::new();
        pipe.expect("piped").read_to_string(&mut text).await.expect("read");
        text
    }

    /// On the calling thread, or on a spawner thread.
    async fn start(
        on_thread: bool,
        command: Command,
        last_check: impl FnMut(&mut Command) -> bool + Send + 'static,
    ) -> io::Result<Option<Child>> {
        if on_thread {
            shared_spawner()
                .expect("spawner threads")
                .spawn(command, last_check)
                .await
        } else {
            spawn_here(command, last_check)
        }
    }

    fn exists(pid: Pid) -> bool {
        std::path::Path::new(&format!("/proc/{}", pid.as_raw_pid())).exists()
    }

    #[tokio::test]
    async fn a_command_gives_its_output_streams_and_exit_status() {
        for on_thread in [false, true] {
            let mut child = start(on_thread, sh("echo out; echo err >&2; exit 3"), |_| true)
                .await
                .expect("spawn")
                .expect("allowed");
            let (out, err) = (read_all(child.stdout.take()).await, read_all(child.stderr.take()).await);
            assert_eq!(child.wait().await.expect("wait").code(), Some(3));
            assert_eq!((out.as_str(), err.as_str()), ("out\n", "err\n"));
            assert!(!exists(child.pid()), "reaped");
        }
    }

    #[tokio::test]
    async fn the_last_check_decides_and_finishes_the_command() {
        for on_thread in [false, true] {
            assert!(start(on_thread, sh("exit 0"), |_| false)
                .await
                .expect("no spawn")
                .is_none());
            let finish = |command: &mut Command| {
                command.arg("echo finished there");
                true
            };
            let mut child = start(on_thread, sh(""), finish).await.expect("spawn").expect("allowed");
            assert_eq!(read_all(child.stdout.take()).await, "finished there\n");
            assert!(child.wait().await.expect("wait").success());
        }
    }

    #[tokio::test]
    async fn a_dropped_command_is_killed_with_its_group_and_reaped() {
        for on_thread in [false, true] {
            let mut child = start(on_thread, sh("sleep 60 & echo $!; wait"), |_| true)
                .await
                .expect("spawn")
                .expect("allowed");
            let mut line = String::new();
            let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
            stdout.read_line(&mut line).await.expect("the background pid");
            let sleeper = Pid::from_raw(line.trim().parse().expect("a pid")).expect("a pid");
            let shell = child.pid();
            drop(child);
            let deadline = Instant::now() + Duration::from_secs(10);
            while exists(shell) || exists(sleeper) {
                assert!(
                    Instant::now() < deadline,
                    "shell {shell:?} or sleeper {sleeper:?} still there"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }

    #[tokio::test]
    async fn spawner_threads_keep_a_table_of_their_own_and_take_no_signals() {
        let held: Vec<_> = (0..500).map(|_| std::io::pipe().expect("pipe")).collect();
        let mut child = shared_spawner()
            .expect("spawner threads")
            .spawn(sh("exit 0"), |_| true)
            .await
            .expect("spawn")
            .expect("allowed");
        child.wait().await.expect("wait");
        // Another test's spawner threads may be alive too: every one must keep to itself.
        let mut spawners = 0;
        for task in std::fs::read_dir("/proc/self/task").expect("tasks") {
            let task = task.expect("task").path();
            // Thread names are cut to 15 bytes.
            let name = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
            if name.trim_end() != "shardcron-spawn" {
                continue;
            }
            let status = std::fs::read_to_string(task.join("status")).unwrap_or_default();
            assert!(
                status
                    .lines()
                    .any(|line| line.starts_with("SigBlk:") && !line.ends_with("0000000000000000")),
                "a spawner thread takes signals"
            );
            let descriptors = std::fs::read_dir(task.join("fd")).map_or(0, Iterator::count);
            assert!(descriptors <= 4, "a spawner thread holds {descriptors} descriptors");
            spawners += 1;
        }
        let threads = std::thread::available_parallelism().map_or(2, usize::from);
        assert!(
            spawners >= threads,
            "{spawners} spawner threads, fewer than {threads} cores"
        );
        assert!(std::fs::read_dir("/proc/self/fd").expect("fds").count() > 1000);
        drop(held);
    }

    #[tokio::test]
    async fn spawner_threads_whose_socket_failed_answer_every_run_and_serve_no_more() {
        let spawner = Spawner::start().expect("spawner threads");
        let mut child = spawner
            .spawn(sh("exit 0"), |_| true)
            .await
            .expect("spawn")
            .expect("allowed");
        child.wait().await.expect("wait");
        rustix::net::shutdown(&spawner._sending, rustix::net::Shutdown::Write).expect("shutdown");
        let deadline = Instant::now() + Duration::from_secs(10);
        while spawner.serves() {
            assert!(Instant::now() < deadline, "the spawner threads still serve");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let asked = tokio::time::timeout(Duration::from_secs(10), spawner.spawn(sh("exit 0"), |_| true))
            .await
            .expect("the run is answered");
        assert!(asked.is_err(), "no command starts through stopped spawner threads");
    }
}
