import java.time.Duration;
import java.util.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * The Java client (kafka-clients 3.9) in a group that migrates online between the classic and the consumer
 * protocols (KIP-848) against kbroker.
 * Usage: MixedGroupCompat BOOTSTRAP TOPIC GROUP PARTITIONS RECORDS ASSIGNOR
 * Two classic members (ASSIGNOR: cooperative-sticky or range) share the topic while records arrive; a member with
 * group.protocol=consumer joins (the broker upgrades the group) until all three hold partitions; it leaves (the
 * broker downgrades the group) and the classic members read every record. Each record consumed is printed as
 * "R partition offset"; "OK ..." per step, "DONE" at the end; exits 1 on a failed check.
 */
public class MixedGroupCompat {
    static void check(boolean cond, String what) {
        if (!cond) {
            System.out.println("FAIL " + what);
            System.out.flush();
            System.exit(1);
        }
    }

    static KafkaConsumer<byte[], byte[]> consumer(String bootstrap, String group, String assignor) {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("group.id", group);
        p.put("auto.offset.reset", "earliest");
        p.put("enable.auto.commit", "false");
        p.put("max.poll.records", "50");
        if (assignor == null) {
            p.put("group.protocol", "consumer");
        } else {
            p.put("group.protocol", "classic");
            p.put("session.timeout.ms", "10000");
            p.put("heartbeat.interval.ms", "300");
            p.put("partition.assignment.strategy", assignor.equals("range")
                ? "org.apache.kafka.clients.consumer.RangeAssignor"
                : "org.apache.kafka.clients.consumer.CooperativeStickyAssignor");
        }
        return new KafkaConsumer<>(p, new ByteArrayDeserializer(), new ByteArrayDeserializer());
    }

    static int seen = 0;
    static final Set<String> distinct = new HashSet<>();
    /** Members whose last commit was refused (by a rebalance): they commit again on their next poll. */
    static final Set<KafkaConsumer<byte[], byte[]>> uncommitted = new HashSet<>();

    /** One poll per member; what it read is printed and committed (a commit refused by a rebalance is retried
     * on the member's next poll, records or not: at-least-once). */
    static void pollAll(List<KafkaConsumer<byte[], byte[]>> members) {
        for (KafkaConsumer<byte[], byte[]> c : members) {
            ConsumerRecords<byte[], byte[]> recs = c.poll(Duration.ofMillis(50));
            for (ConsumerRecord<byte[], byte[]> r : recs) {
                System.out.println("R " + r.partition() + " " + r.offset());
                distinct.add(r.partition() + ":" + r.offset());
                seen++;
            }
            if (!recs.isEmpty() || uncommitted.contains(c)) {
                try {
                    c.commitSync(Duration.ofSeconds(5));
                    uncommitted.remove(c);
                } catch (RuntimeException e) {
                    System.out.println("COMMIT-RETRY " + e.getClass().getSimpleName());
                    uncommitted.add(c);
                }
            }
        }
    }

    static int assigned(List<KafkaConsumer<byte[], byte[]>> members) {
        int n = 0;
        for (KafkaConsumer<byte[], byte[]> c : members) n += c.assignment().size();
        return n;
    }

    public static void main(String[] args) {
        String bootstrap = args[0], topic = args[1], group = args[2], assignor = args[5];
        int partitions = Integer.parseInt(args[3]), records = Integer.parseInt(args[4]);
        KafkaConsumer<byte[], byte[]> c1 = consumer(bootstrap, group, assignor);
        KafkaConsumer<byte[], byte[]> c2 = consumer(bootstrap, group, assignor);
        List<KafkaConsumer<byte[], byte[]>> classic = List.of(c1, c2);
        for (KafkaConsumer<byte[], byte[]> c : classic) c.subscribe(List.of(topic));
        long deadline = System.currentTimeMillis() + 60000;
        // 1. the classic group: both members hold partitions
        while (c1.assignment().isEmpty() || c2.assignment().isEmpty() || assigned(classic) != partitions) {
            pollAll(classic);
            check(System.currentTimeMillis() < deadline, "classic members share the partitions");
        }
        System.out.println("OK classic " + c1.assignment().size() + " " + c2.assignment().size());
        // 2. a consumer-protocol member joins: the three of them hold every partition exactly once
        KafkaConsumer<byte[], byte[]> c3 = consumer(bootstrap, group, null);
        c3.subscribe(List.of(topic));
        List<KafkaConsumer<byte[], byte[]>> all = List.of(c1, c2, c3);
        int stableRounds = 0;
        while (stableRounds < 10) {
            pollAll(all);
            boolean spread = !c1.assignment().isEmpty() && !c2.assignment().isEmpty() && !c3.assignment().isEmpty()
                && assigned(all) == partitions;
            stableRounds = spread ? stableRounds + 1 : 0;
            check(System.currentTimeMillis() < deadline, "three members share the partitions: "
                + c1.assignment().size() + " " + c2.assignment().size() + " " + c3.assignment().size());
        }
        System.out.println("OK mixed " + c1.assignment().size() + " " + c2.assignment().size() + " "
            + c3.assignment().size());
        // 3. it leaves: the classic members take everything back and read every record
        c3.close();
        uncommitted.remove(c3);  // its partitions' new owners read on from its last commit and commit them
        System.out.println("OK consumer member left");
        while (assigned(classic) != partitions || distinct.size() < records || !uncommitted.isEmpty()) {
            pollAll(classic);
            check(System.currentTimeMillis() < deadline,
                  "classic members after the downgrade: " + assigned(classic) + " partitions, "
                  + distinct.size() + " records, " + uncommitted.size() + " members to commit again");
        }
        System.out.println("OK classic again " + distinct.size() + " " + seen);
        c1.close();
        c2.close();
        System.out.println("DONE");
    }
}
