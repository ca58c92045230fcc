// The sockets of this process's HTTP connections, closed in a process forked
// from it.
//
// A DataLoader worker forked from a process that read URLs inherits a copy of
// every socket of its parent's connections. It never uses them (its curl
// handles are its own: http_client.cpp abandons the inherited ones), yet its
// copies kept them open for as long as it lived: a connection the parent or
// the server closed stayed half-open in the kernel, and each worker held as
// many descriptors as its parent had connections. Every socket libcurl makes
// for us is made here and recorded (with its inode, so that a number the
// parent reused for something else is never taken for it); a fork's child
// closes its copies of the recorded ones at once (pthread_atfork).
#pragma once

namespace torch_shards::io::storage {

// socket(family, type, protocol), recorded while open: libcurl's
// CURLOPT_OPENSOCKETFUNCTION makes its sockets here. -1 with errno on failure.
int open_connection_socket(int family, int type, int protocol);

// Closes a socket made by open_connection_socket (CURLOPT_CLOSESOCKETFUNCTION).
int close_connection_socket(int fd);

}  // namespace torch_shards::io::storage
