// pipe.js: TCP servers on Node's net module that move bytes with stream.pipe, as Node
// proxies do. `echo` pipes each socket into itself; `proxy` pipes each socket to a new
// connection to the upstream and back. Half-closes are passed on (allowHalfOpen).
//
// Usage: node pipe.js echo HOST PORT READY_FILE
//        node pipe.js proxy HOST PORT READY_FILE UPSTREAM_HOST UPSTREAM_PORT
// The ready file is created once the server listens.
'use strict';

const fs = require('fs');
const net = require('net');

const [mode, host, port, ready, upHost, upPort] = process.argv.slice(2);
if (!['echo', 'proxy'].includes(mode) || !ready || (mode === 'proxy' && !upPort)) {
  console.error('usage: pipe.js echo|proxy HOST PORT READY_FILE [UPSTREAM_HOST UPSTREAM_PORT]');
  process.exit(2);
}

const server = net.createServer({ allowHalfOpen: true }, (sock) => {
  sock.on('error', (e) => console.error(`pipe.js: ${mode} ${sock.remoteAddress}: ${e.message}`));
  if (mode === 'echo') {
    sock.pipe(sock);
    return;
  }
  const up = net.connect({ host: upHost, port: Number(upPort), allowHalfOpen: true });
  up.on('error', (e) => {
    console.error(`pipe.js: upstream ${upHost}:${upPort}: ${e.message}`);
    sock.destroy();
  });
  sock.pipe(up);
  up.pipe(sock);
});
server.on('error', (e) => {
  console.error(`pipe.js: listen on ${host}:${port}: ${e.message}`);
  process.exit(1);
});
server.listen(Number(port), host, () => fs.writeFileSync(ready, ''));
