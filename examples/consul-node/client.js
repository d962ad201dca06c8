// A Node program on the npm package `consul` that reads metasync's Consul
// facade as it would read a Consul agent: agent/self, the catalog's
// services, then a blocking health query loop on one service that prints
// its instances at every change.
//
//   CONSUL_HTTP_ADDR=127.0.0.1:8500 node client.js SERVICE [CHANGES]
//
// With CHANGES it exits after printing that many answers; without, it
// follows the service until it is stopped.
"use strict";

const { EventEmitter } = require("events");
const Consul = require("consul");

const [service, changes] = process.argv.slice(2);
if (!service) {
  console.error("usage: node client.js SERVICE [CHANGES]");
  process.exit(2);
}
const addr = process.env.CONSUL_HTTP_ADDR || "127.0.0.1:8500";
const colon = addr.lastIndexOf(":");
const consul = new Consul({
  host: addr.slice(0, colon).replace(/^\[|\]$/g, ""),
  port: Number(addr.slice(colon + 1)),
});

// includeResponse makes each call answer [response, body], so that the
// loop reads X-Consul-Index; a "cancel" event aborts the call in flight.
const ctx = new EventEmitter();
ctx.includeResponse = true;
let stopping = false;
for (const signal of ["SIGINT", "SIGTERM"]) {
  process.on(signal, () => {
    stopping = true;
    ctx.emit("cancel");
  });
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function main() {
  const self = await consul.agent.self();
  console.log(`agent: datacenter ${self.Config.Datacenter}, node ${self.Config.NodeName}`);
  const services = await consul.catalog.service.list();
  console.log(`catalog: ${Object.keys(services).sort().join(" ")}`);

  let index = "0";
  let printed = 0;
  while (!stopping) {
    let res, entries;
    try {
      // wait: 1m, and a timeout above it (the server may add up to a
      // sixteenth of the wait).
      [res, entries] = await consul.health.service({
        service,
        passing: true,
        index,
        wait: "1m",
        timeout: 75000,
        ctx,
      });
    } catch (err) {
      if (stopping) break;
      console.error(`health.service: ${err.message}`);
      await sleep(1000);
      continue;
    }
    const next = BigInt(res.headers["x-consul-index"] || "0");
    const prev = BigInt(index);
    if (next === prev) continue; // the wait ran out: nothing changed
    // Consul's rules for a blocking loop: an index that goes backwards
    // starts over from 0, one below 1 is taken as 1.
    index = (next < prev ? 0n : next < 1n ? 1n : next).toString();
    const instances = entries.map((e) => `${e.Service.Address}:${e.Service.Port}`).sort();
    console.log(`index ${next}: ${instances.join(" ") || "(none)"}`);
    if (changes && ++printed >= Number(changes)) break;
  }
  consul.destroy();
}

main().catch((err) => {
  console.error(err.message);
  process.exit(1);
});
