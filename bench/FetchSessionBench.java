import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicIntegerArray;
import java.util.concurrent.atomic.AtomicLongArray;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.RoundRobinAssignor;
import org.apache.kafka.common.Metric;
import org.apache.kafka.common.MetricName;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * The Java client (kafka-clients 3.9) for bench/fetch_sessions.py; talks to the Python side line by line
 * (stdout: its lines, stdin: the go-ahead), so the caller can read the broker's CPU and gauges at exact points.
 *
 * <p>{@code consume <bootstrap> <file>}: one consumer, no group, assigned every partition in the file (lines
 * {@code topic partition start end}); after metadata is known prints {@code READY}, waits for a stdin line, seeks
 * to the starts and polls until every partition reached its end: {@code CONSUMED <records> <bytes> <seconds>}.
 * Then waits for another stdin line before closing (the fetch session is still open meanwhile).
 *
 * <p>{@code idle <bootstrap> <consumers> <group> <topics file>}: that many consumers in one group (round-robin
 * assignor), each in its own thread polling forever; every second prints {@code STATUS <assigned partitions total>
 * <min per consumer> <max per consumer> <fetch requests sent, total> <rebalances seen, total>}. Exits on a stdin
 * line.
 */
public final class FetchSessionBench {
    public static void main(String[] argv) throws Exception {
        String mode = argv[0];
        String bootstrap = argv[1];
        if (mode.equals("consume")) {
            consume(bootstrap, argv[2]);
        } else if (mode.equals("idle")) {
            idle(bootstrap, Integer.parseInt(argv[2]), argv[3], argv[4]);
        } else {
            System.err.println("unknown mode " + mode);
            System.exit(2);
        }
        System.exit(0);
    }

    static Properties base(String bootstrap) {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        return p;
    }

    static void say(String s) {
        System.out.println(s);
        System.out.flush();
    }

    static void consume(String bootstrap, String file) throws Exception {
        Map<TopicPartition, long[]> want = new HashMap<>();  // partition -> {start, end}
        for (String line : Files.readAllLines(Paths.get(file), StandardCharsets.UTF_8)) {
            String[] f = line.trim().split(" ");
            if (f.length == 4) {
                want.put(new TopicPartition(f[0], Integer.parseInt(f[1])),
                        new long[] {Long.parseLong(f[2]), Long.parseLong(f[3])});
            }
        }
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(base(bootstrap))) {
            c.listTopics(Duration.ofSeconds(30));  // connected, metadata known
            say("READY");
            in.readLine();
            long t0 = System.nanoTime();
            c.assign(want.keySet());
            long total = 0;
            for (Map.Entry<TopicPartition, long[]> e : want.entrySet()) {
                c.seek(e.getKey(), e.getValue()[0]);
                total += e.getValue()[1] - e.getValue()[0];
            }
            int open = 0;
            for (long[] se : want.values()) {
                if (se[1] > se[0]) open++;
            }
            long records = 0;
            long bytes = 0;
            long deadline = System.currentTimeMillis() + 300_000;
            while (open > 0 && System.currentTimeMillis() < deadline) {
                ConsumerRecords<byte[], byte[]> rs = c.poll(Duration.ofMillis(500));
                for (ConsumerRecord<byte[], byte[]> r : rs) {
                    long[] se = want.get(new TopicPartition(r.topic(), r.partition()));
                    if (r.offset() < se[1]) {
                        records++;
                        bytes += r.value() == null ? 0 : r.value().length;
                        if (r.offset() == se[1] - 1) open--;
                    }
                }
            }
            double secs = (System.nanoTime() - t0) / 1e9;
            say("CONSUMED " + records + " " + bytes + " " + secs + " " + total);
            in.readLine();
        }
    }

    static void idle(String bootstrap, int n, String group, String topicsFile) throws Exception {
        List<String> topics = new ArrayList<>();
        for (String line : Files.readAllLines(Paths.get(topicsFile), StandardCharsets.UTF_8)) {
            if (!line.isBlank()) topics.add(line.trim());
        }
        AtomicIntegerArray assigned = new AtomicIntegerArray(n);
        AtomicLongArray fetches = new AtomicLongArray(n);
        AtomicLongArray rebalances = new AtomicLongArray(n);
        AtomicBoolean stop = new AtomicBoolean();
        List<Thread> threads = new ArrayList<>();
        List<KafkaConsumer<byte[], byte[]>> consumers = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            Properties p = base(bootstrap);
            p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
            p.put(ConsumerConfig.CLIENT_ID_CONFIG, group + "-" + i);
            p.put(ConsumerConfig.PARTITION_ASSIGNMENT_STRATEGY_CONFIG, RoundRobinAssignor.class.getName());
            consumers.add(new KafkaConsumer<>(p));
        }
        for (int i = 0; i < n; i++) {
            final int k = i;
            final KafkaConsumer<byte[], byte[]> c = consumers.get(i);
            Thread t = new Thread(() -> {
                c.subscribe(topics);
                Metric fetchTotal = null;
                java.util.Set<TopicPartition> last = java.util.Collections.emptySet();
                while (!stop.get()) {
                    try {
                        c.poll(Duration.ofMillis(1000));
                    } catch (org.apache.kafka.common.errors.WakeupException e) {
                        break;
                    }
                    java.util.Set<TopicPartition> now = c.assignment();
                    if (!now.equals(last)) {
                        rebalances.incrementAndGet(k);
                        last = new java.util.HashSet<>(now);
                    }
                    assigned.set(k, now.size());
                    if (fetchTotal == null) {
                        for (Map.Entry<MetricName, ? extends Metric> m : c.metrics().entrySet()) {
                            if (m.getKey().name().equals("fetch-total")
                                    && m.getKey().group().equals("consumer-fetch-manager-metrics")) {
                                fetchTotal = m.getValue();
                            }
                        }
                    }
                    if (fetchTotal != null) fetches.set(k, (long) ((Double) fetchTotal.metricValue()).doubleValue());
                }
            }, "consumer-" + i);
            t.setDaemon(true);
            threads.add(t);
        }
        for (Thread t : threads) t.start();
        Thread status = new Thread(() -> {
            while (true) {
                int total = 0;
                int min = Integer.MAX_VALUE;
                int max = 0;
                long f = 0;
                long r = 0;
                for (int i = 0; i < n; i++) {
                    int a = assigned.get(i);
                    total += a;
                    min = Math.min(min, a);
                    max = Math.max(max, a);
                    f += fetches.get(i);
                    r += rebalances.get(i);
                }
                say("STATUS " + total + " " + min + " " + max + " " + f + " " + r);
                try {
                    Thread.sleep(1000);
                } catch (InterruptedException e) {
                    return;
                }
            }
        });
        status.setDaemon(true);
        status.start();
        new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8)).readLine();
        stop.set(true);
    }
}
