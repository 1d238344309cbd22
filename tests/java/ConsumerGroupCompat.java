import java.time.Duration;
import java.util.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * The Java client (kafka-clients 3.9) with group.protocol=consumer (KIP-848) against kbroker.
 * Usage: ConsumerGroupCompat BOOTSTRAP TOPIC GROUP PARTITIONS RECORDS
 * Two members share the topic's partitions, one leaves, the other gets every partition; both commit.
 * Prints "OK ..." per step and "DONE" at the end; exits 1 on a failed check.
 */
public class ConsumerGroupCompat {
    static void check(boolean cond, String what) {
        if (!cond) {
            System.out.println("FAIL " + what);
            System.out.flush();
            System.exit(1);
        }
    }

    static KafkaConsumer<byte[], byte[]> consumer(String bootstrap, String group) {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("group.id", group);
        p.put("group.protocol", "consumer");
        p.put("auto.offset.reset", "earliest");
        p.put("enable.auto.commit", "false");
        p.put("max.poll.records", "20");
        return new KafkaConsumer<>(p, new ByteArrayDeserializer(), new ByteArrayDeserializer());
    }

    public static void main(String[] args) {
        String bootstrap = args[0], topic = args[1], group = args[2];
        int partitions = Integer.parseInt(args[3]), records = Integer.parseInt(args[4]);
        Set<String> seen = new HashSet<>();
        KafkaConsumer<byte[], byte[]> c1 = consumer(bootstrap, group), c2 = consumer(bootstrap, group);
        c1.subscribe(List.of(topic));
        c2.subscribe(List.of(topic));
        long deadline = System.currentTimeMillis() + 60000;
        // 1. both members get partitions, and between them all of them
        while (true) {
            for (KafkaConsumer<byte[], byte[]> c : List.of(c1, c2))
                for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(100)))
                    seen.add(r.partition() + ":" + r.offset());
            int a1 = c1.assignment().size(), a2 = c2.assignment().size();
            if (a1 > 0 && a2 > 0 && a1 + a2 == partitions) {
                System.out.println("OK shared " + a1 + " " + a2);
                break;
            }
            check(System.currentTimeMillis() < deadline, "partitions shared by both members: " + a1 + " " + a2);
        }
        c1.commitSync();
        c2.commitSync();
        System.out.println("OK committed by both");
        // 2. one leaves: the other ends up with every partition and reads every record
        c2.close();
        System.out.println("OK c2 closed");
        while (c1.assignment().size() < partitions || seen.size() < records) {
            for (ConsumerRecord<byte[], byte[]> r : c1.poll(Duration.ofMillis(100)))
                seen.add(r.partition() + ":" + r.offset());
            check(System.currentTimeMillis() < deadline,
                  "takeover: " + c1.assignment().size() + " partitions, " + seen.size() + " records");
        }
        System.out.println("OK takeover " + c1.assignment().size() + " " + seen.size());
        c1.commitSync();
        Map<TopicPartition, OffsetAndMetadata> committed = c1.committed(new HashSet<>(c1.assignment()));
        long sum = 0;
        for (OffsetAndMetadata o : committed.values()) sum += o.offset();
        System.out.println("OK committed " + sum);
        c1.close();
        System.out.println("DONE");
    }
}
