/*
 * A Java gRPC client that routes by model name through metasync's xDS
 * server, with no metasync code: grpc-xds reads the bootstrap named by
 * GRPC_XDS_BOOTSTRAP (the daemon's --xds-listen address, and a node with a
 * locality) and resolves xds:/// targets itself.
 *
 *   GRPC_XDS_BOOTSTRAP=bootstrap.json java -jar target/xds-java-client.jar xds:///chains/model-to-endpoints/model1 6
 *   GRPC_XDS_BOOTSTRAP=bootstrap.json java -jar target/xds-java-client.jar xds:///chains/model-to-endpoints/model1 --for 30
 */
package com.github.iidp.metasync.examples.xds;

import io.grpc.CallOptions;
import io.grpc.ClientCall;
import io.grpc.Grpc;
import io.grpc.InsecureChannelCredentials;
import io.grpc.ManagedChannel;
import io.grpc.Status;
import io.grpc.health.v1.HealthCheckRequest;
import io.grpc.health.v1.HealthCheckResponse;
import io.grpc.health.v1.HealthGrpc;
import io.grpc.stub.ClientCalls;
import java.net.Inet6Address;
import java.net.InetSocketAddress;
import java.net.SocketAddress;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;

/**
 * Calls the standard gRPC health service ({@code grpc.health.v1.Health/Check})
 * of whichever backend round robin picks, and prints who answered each call
 * ({@code call N: answered by IP:PORT}) or the error ({@code call N: CODE:
 * DESCRIPTION}). The first call waits up to 10 s for the channel's first
 * xDS answer (a JVM takes a second or two to load grpc-xds and resolve a
 * target); each other call has 2 s.
 *
 * <p>With CALLS (6 by default) it makes that many calls, 100 ms apart (a
 * second after an error). With {@code --for SECONDS} it calls without
 * pause for that long, or until it is interrupted (SIGINT or SIGTERM), then
 * prints {@code calls: N, failed: F} and exits 1 if a call failed: the
 * check of a rollout, which must fail none.
 */
public final class Client {
  private Client() {}

  /** How long one call may take. */
  private static final long DEADLINE_MS = 2000;

  /** How long the first call may take, the target's resolution included. */
  private static final long FIRST_DEADLINE_MS = 10000;

  /** Set when the continuous mode is asked to stop early. */
  private static volatile boolean stopped;

  /** Runs {@code TARGET [CALLS]} or {@code TARGET --for SECONDS}. */
  public static void main(String[] args) throws InterruptedException {
    String target = args.length > 0 ? args[0] : "xds:///chains/model-to-endpoints/model1";
    ManagedChannel channel = Grpc.newChannelBuilder(target, InsecureChannelCredentials.create()).build();
    int status;
    if (args.length > 2 && args[1].equals("--for")) {
      status = continuous(channel, Long.parseLong(args[2]));
    } else {
      int calls = args.length > 1 ? Integer.parseInt(args[1]) : 6;
      for (int n = 1; n <= calls; n++) {
        boolean ok = call(channel, n);
        if (n < calls) {
          Thread.sleep(ok ? 100 : 1000);
        }
      }
      status = 0;
    }
    channel.shutdownNow();
    System.exit(status); // the xDS client's stream would keep the process alive
  }

  /**
   * Calls back to back for seconds, or until interrupted, and reports the
   * calls that failed; returns the exit status.
   */
  private static int continuous(ManagedChannel channel, long seconds) {
    CountDownLatch done = new CountDownLatch(1);
    int[] status = {0};
    Runtime.getRuntime().addShutdownHook(new Thread(() -> {
      if (done.getCount() == 0) {
        return; // a normal exit
      }
      stopped = true;
      try {
        done.await(FIRST_DEADLINE_MS + 1000, TimeUnit.MILLISECONDS);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
      Runtime.getRuntime().halt(status[0]); // the summary's status, not the signal's
    }));
    long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(seconds);
    int calls = 0;
    int failed = 0;
    while (!stopped && System.nanoTime() < end) {
      calls++;
      if (!call(channel, calls)) {
        failed++;
      }
    }
    System.out.println("calls: " + calls + ", failed: " + failed);
    System.out.flush();
    status[0] = failed == 0 ? 0 : 1;
    done.countDown();
    return status[0];
  }

  /** Makes call n, prints its line, and reports whether it succeeded. */
  private static boolean call(ManagedChannel channel, int n) {
    long deadline = n == 1 ? FIRST_DEADLINE_MS : DEADLINE_MS;
    ClientCall<HealthCheckRequest, HealthCheckResponse> call = channel.newCall(
        HealthGrpc.getCheckMethod(), CallOptions.DEFAULT.withDeadlineAfter(deadline, TimeUnit.MILLISECONDS));
    try {
      ClientCalls.futureUnaryCall(call, HealthCheckRequest.getDefaultInstance()).get();
    } catch (ExecutionException e) {
      Status s = Status.fromThrowable(e.getCause());
      System.out.println("call " + n + ": " + s.getCode() + ": " + s.getDescription());
      return false;
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      System.out.println("call " + n + ": CANCELLED: interrupted");
      return false;
    }
    // The transport's remote address: the backend this call went to.
    System.out.println("call " + n + ": answered by " + hostPort(call.getAttributes().get(Grpc.TRANSPORT_ATTR_REMOTE_ADDR)));
    return true;
  }

  /** Spells a peer address as IP:PORT ([IP]:PORT for IPv6). */
  private static String hostPort(SocketAddress addr) {
    if (!(addr instanceof InetSocketAddress)) {
      return String.valueOf(addr);
    }
    InetSocketAddress in = (InetSocketAddress) addr;
    String ip = in.getAddress().getHostAddress();
    if (in.getAddress() instanceof Inet6Address) {
      ip = "[" + ip + "]";
    }
    return ip + ":" + in.getPort();
  }
}
