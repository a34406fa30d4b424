// server.js: the Node.js peer of bench/ws_compare, one process on the ws package.
//   node server.js PORT [deflate]
// /echo sends every message back; /broadcast keeps its sockets in one set, and a message
// from any of them sends a 1 KiB text to all; with "deflate", permessage-deflate is
// accepted without context takeover either way.
'use strict';
const http = require('http');
const { WebSocketServer } = require('ws');

const port = Number(process.argv[2]);
const deflate = process.argv[3] === 'deflate';
const payload = 'x'.repeat(1024);
const wss = new WebSocketServer({
  noServer: true,
  perMessageDeflate: deflate
    ? { serverNoContextTakeover: true, clientNoContextTakeover: true, threshold: 64 }
    : false,
});
const all = new Set();

const server = http.createServer((req, res) => {
  res.writeHead(200, { 'content-type': 'text/plain' });
  res.end('hello world');
});
server.keepAliveTimeout = 300000;
server.on('upgrade', (req, socket, head) => {
  wss.handleUpgrade(req, socket, head, (ws) => {
    if (req.url === '/broadcast') {
      all.add(ws);
      ws.on('close', () => all.delete(ws));
      ws.on('message', () => {
        for (const peer of all) peer.send(payload);
      });
    } else {
      ws.on('message', (data, binary) => ws.send(data, { binary }));
    }
  });
});
server.listen(port, '127.0.0.1');
