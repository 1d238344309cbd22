import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.*;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * One Java (kafka-clients 3.9) member of a KIP-848 group (group.protocol=consumer), in a JVM of its own so that a
 * test can kill -9 it. Usage: ConsumerGroupMember BOOTSTRAP TOPIC GROUP
 * Prints, each line flushed at once (a SIGKILL loses nothing that was consumed before it):
 *   "M memberId" once, when it first has partitions;
 *   "R monotonicSeconds partition offset value" per record (System.nanoTime is CLOCK_MONOTONIC on Linux, the
 *   clock of Python's time.monotonic);
 *   "CLOSED" after a clean close, which starts when stdin reaches EOF.
 * Offsets are auto-committed every 200 ms. Mirrors tests/consumer_member.py; tests/group_kill.py drives both.
 */
public class ConsumerGroupMember {
    public static void main(String[] args) {
        String bootstrap = args[0], topic = args[1], group = args[2];
        AtomicBoolean stop = new AtomicBoolean();
        Thread eof = new Thread(() -> {
            try {
                while (System.in.read() != -1) { }
            } catch (IOException e) {
                // stdin gone: stop as on EOF
            }
            stop.set(true);
        });
        eof.setDaemon(true);
        eof.start();
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("group.id", group);
        p.put("group.protocol", "consumer");
        p.put("auto.offset.reset", "earliest");
        p.put("enable.auto.commit", "true");
        p.put("auto.commit.interval.ms", "200");
        boolean announced = false;
        Map<Integer, Long> returned = new HashMap<>();  // partition -> offset of the last record printed
        try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(p, new ByteArrayDeserializer(),
                                                                   new ByteArrayDeserializer())) {
            c.subscribe(List.of(topic));
            while (!stop.get()) {
                ConsumerRecords<byte[], byte[]> records;
                try {
                    records = c.poll(Duration.ofMillis(100));
                } catch (IllegalStateException e) {
                    // kafka-clients 3.9's new consumer races its own background thread: a partition revoked between
                    // FetchCollector's isAssigned check and its position read throws here (KAFKA-20332, fixed in
                    // later clients), and the records this poll had already collected for other partitions are
                    // dropped with their positions advanced. Rewind those to what this member really returned.
                    if (e.getMessage() == null || !e.getMessage().startsWith("No current assignment for partition"))
                        throw e;
                    System.err.println("client race on revocation, rewinding and polling again: " + e.getMessage());
                    for (TopicPartition tp : c.assignment()) {
                        try {
                            Long last = returned.get(tp.partition());
                            OffsetAndMetadata committed = last == null ? c.committed(Set.of(tp)).get(tp) : null;
                            if (last != null)
                                c.seek(tp, last + 1);
                            else if (committed != null)
                                c.seek(tp, committed.offset());
                            else
                                c.seekToBeginning(List.of(tp));
                        } catch (IllegalStateException gone) {
                            // revoked meanwhile: its next owner starts from the group's commit
                        }
                    }
                    continue;
                }
                if (!announced && !c.assignment().isEmpty()) {
                    System.out.println("M " + c.groupMetadata().memberId());
                    System.out.flush();
                    announced = true;
                }
                for (ConsumerRecord<byte[], byte[]> r : records) {
                    returned.put(r.partition(), r.offset());
                    String value = r.value() == null ? "" : new String(r.value(), StandardCharsets.UTF_8);
                    System.out.println(String.format(Locale.ROOT, "R %.6f %d %d %s", System.nanoTime() / 1e9,
                                                     r.partition(), r.offset(), value));
                    System.out.flush();
                }
            }
        }
        System.out.println("CLOSED");
        System.out.flush();
    }
}
