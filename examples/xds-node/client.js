// A Node gRPC client that routes by model name through metasync's xDS
// server, with no metasync code: grpc-js-xds reads the bootstrap named by
// GRPC_XDS_BOOTSTRAP (bootstrap.json: the daemon's --xds-listen address,
// and a node with a locality) and resolves xds:/// targets itself.
//
//   GRPC_XDS_BOOTSTRAP=bootstrap.json node client.js xds:///chains/model-to-endpoints/model1 6
//
// It calls the standard gRPC health service CALLS times, a second apart
// at most, and prints who answered each call, or the error.
'use strict';
const grpc = require('@grpc/grpc-js');
require('@grpc/grpc-js-xds').register();

const target = process.argv[2] || 'xds:///chains/model-to-endpoints/model1';
const calls = Number(process.argv[3] || 6);
const client = new grpc.Client(target, grpc.credentials.createInsecure());
// grpc.health.v1.HealthCheckRequest{} is an empty message: no bytes.
const check = (cb) => {
  const call = client.makeUnaryRequest('/grpc.health.v1.Health/Check', () => Buffer.alloc(0), (b) => b, {},
    { deadline: Date.now() + 2000 }, (err) => cb(err, call.getPeer()));
};

let n = 0;
const next = () => {
  if (n++ === calls) {
    client.close();
    process.exit(0); // the xDS client's stream would keep the process alive
  }
  check((err, peer) => {
    console.log(err ? `call ${n}: ${grpc.status[err.code]}: ${err.details}` : `call ${n}: answered by ${peer}`);
    setTimeout(next, err ? 1000 : 100);
  });
};
next();
