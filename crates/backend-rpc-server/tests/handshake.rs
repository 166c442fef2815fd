//! Our server's connection rules over real sockets, with raw protocol bytes: HELLO must come
//! first, exactly once, with its exact size; `max_clients` refuses the connection beyond the
//! limit and admits again once a client has gone; `idle_timeout` closes a silent connection
//! but not a talking one. Each refusal closes only that connection: the server goes on.
//!
//! The rules are also checked on a socket-less [`backend_rpc_server::Session`], for the typed error.
//! Waits are bounded (a read timeout of 10 s turns a connection the server failed to close
//! into a failure); nothing is timed.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use backend_rpc::wire::{CONN_CAPS_SIZE, Command};
use backend_rpc_server::{ServerConfig, ServerError, ServerHandle};

fn config() -> ServerConfig {
    ServerConfig {
        max_clients: 2,
        ..ServerConfig::default()
    }
}

fn spawn(cfg: ServerConfig) -> ServerHandle {
    common::mem_server(cfg).spawn("127.0.0.1:0").unwrap()
}

fn connect(h: &ServerHandle) -> TcpStream {
    let s = TcpStream::connect(h.local_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

fn send(s: &mut TcpStream, cmd: u8, payload: &[u8]) {
    let mut msg = vec![cmd];
    msg.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    msg.extend_from_slice(payload);
    // the server may already have closed the connection; that shows in the read
    let _ = s.write_all(&msg);
}

/// The next response payload, or `None` when the server closed the connection.
fn recv(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut size = [0u8; 8];
    match s.read_exact(&mut size) {
        Ok(()) => {}
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset
            ) =>
        {
            return None;
        }
        Err(e) => panic!("no response and no close: {e}"),
    }
    let mut v = vec![0u8; u64::from_le_bytes(size) as usize];
    s.read_exact(&mut v).unwrap();
    Some(v)
}

fn hello(s: &mut TcpStream) -> Option<Vec<u8>> {
    send(s, Command::Hello as u8, &[0u8; CONN_CAPS_SIZE]);
    recv(s)
}

/// A client that says HELLO and is answered with protocol 7.
fn good_client(h: &ServerHandle) -> TcpStream {
    let mut s = connect(h);
    let r = hello(&mut s).expect("HELLO answered");
    assert_eq!(&r[..3], &[7, 0, 0]);
    s
}

fn device_count(s: &mut TcpStream) -> Option<u32> {
    send(s, Command::DeviceCount as u8, &[]);
    recv(s).map(|r| u32::from_le_bytes(r.try_into().unwrap()))
}

#[test]
fn hello_must_come_first() {
    let h = spawn(config());
    let mut s = connect(&h);
    assert_eq!(device_count(&mut s), None, "closed: no HELLO yet");
    // the server goes on
    let mut ok = good_client(&h);
    assert_eq!(device_count(&mut ok), Some(1));

    let session = common::mem_server(config()).session();
    assert_eq!(
        session.check_header(Command::DeviceCount as u8, 0),
        Err(ServerError::Handshake("the first command must be HELLO"))
    );
}

#[test]
fn a_second_hello_closes_the_connection() {
    let h = spawn(config());
    let mut s = good_client(&h);
    assert_eq!(hello(&mut s), None, "closed at the second HELLO");
    let mut ok = good_client(&h);
    assert_eq!(device_count(&mut ok), Some(1));

    let mut session = common::mem_server(config()).session();
    session
        .handle(Command::Hello as u8, &[0u8; CONN_CAPS_SIZE])
        .unwrap();
    assert_eq!(
        session.check_header(Command::Hello as u8, CONN_CAPS_SIZE as u64),
        Err(ServerError::Handshake("second HELLO"))
    );
}

#[test]
fn a_hello_of_the_wrong_size_closes_the_connection() {
    // More slots than connections made: the server counts a closed connection out on its own
    // thread, possibly after this client has seen the close, and this test is not about the
    // client limit.
    let h = spawn(ServerConfig {
        max_clients: 8,
        ..config()
    });
    for size in [0, CONN_CAPS_SIZE - 1, CONN_CAPS_SIZE + 1] {
        let mut s = connect(&h);
        send(&mut s, Command::Hello as u8, &vec![0u8; size]);
        assert_eq!(recv(&mut s), None, "HELLO of {size} bytes");
        let session = common::mem_server(config()).session();
        assert_eq!(
            session.check_header(Command::Hello as u8, size as u64),
            Err(ServerError::BadSize {
                cmd: Command::Hello,
                expected: CONN_CAPS_SIZE as u64,
                got: size as u64,
            })
        );
    }
    let mut ok = good_client(&h);
    assert_eq!(device_count(&mut ok), Some(1));
}

#[test]
fn max_clients_refuses_the_next_client_until_one_leaves() {
    let h = spawn(config());
    let mut a = good_client(&h);
    let b = good_client(&h);
    // a third connection is accepted by the kernel and then closed by the server
    let mut c = connect(&h);
    assert_eq!(hello(&mut c), None, "third client refused");
    assert_eq!(
        device_count(&mut a),
        Some(1),
        "the first two are still served"
    );
    drop(b);
    // the server notices b's close on its own thread: retry until admitted (bounded)
    let t0 = Instant::now();
    let mut d = loop {
        let mut d = connect(&h);
        if hello(&mut d).is_some() {
            break d;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no client admitted after one left"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(device_count(&mut d), Some(1));
    assert_eq!(device_count(&mut a), Some(1));
}

/// The idle timeout is long against the talker's pace (a message every 20 ms against 1 s of
/// allowed silence), so only a thread stalled for a whole second could make the talker look
/// idle: load on a 2-core machine cannot fail this test, where 100 ms against 300 ms could.
#[test]
fn idle_timeout_closes_a_silent_connection_only() {
    let timeout = Duration::from_secs(1);
    let pace = Duration::from_millis(20);
    let h = spawn(ServerConfig {
        idle_timeout: Some(timeout),
        ..config()
    });
    let mut silent = good_client(&h);
    let mut talker = good_client(&h);
    // the talker speaks every `pace` for two timeouts; the silent one says nothing
    let t0 = Instant::now();
    while t0.elapsed() < 2 * timeout {
        assert_eq!(device_count(&mut talker), Some(1), "a talking client stays");
        std::thread::sleep(pace);
    }
    assert_eq!(
        device_count(&mut silent),
        None,
        "the silent client was closed"
    );
    // and its place is free again
    let mut again = good_client(&h);
    assert_eq!(device_count(&mut again), Some(1));
}
