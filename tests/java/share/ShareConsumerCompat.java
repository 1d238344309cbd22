import java.time.Duration;
import java.util.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.serialization.StringDeserializer;

/**
 * A KafkaShareConsumer 4.2 (explicit acknowledgement) reading a share group until `count` distinct records
 * are accepted. Records whose value ends in "release" are released on their first delivery and "reject" are
 * rejected; prints "ACCEPT p offset value delivery" per accepted record whose acknowledgement the broker confirmed
 * (commitSync's result names its partition without an error),
 * "REJECT ..." per rejection, "ACKFAIL p offset value delivery error" per acknowledgement the broker refused (the
 * record comes back: delivery is at least once), then DONE. "COMMIT startMs endMs" (wall clock) comes before the
 * ACCEPT and ACKFAIL lines of each commitSync.
 * Args: bootstrap topic group count idleMs maxPollRecords pauseMs (a pause per poll, a slow worker)
 *       [firstRecordMs: how long to wait for a first record, 90 s by default]
 */
public class ShareConsumerCompat {
    public static void main(String[] args) {
        Properties props = new Properties();
        props.put("bootstrap.servers", args[0]);
        props.put("group.id", args[2]);
        props.put("share.acknowledgement.mode", "explicit");
        props.put("max.poll.records", args[5]);
        props.put("key.deserializer", StringDeserializer.class.getName());
        props.put("value.deserializer", StringDeserializer.class.getName());
        int count = Integer.parseInt(args[3]);
        long idleMs = Long.parseLong(args[4]);
        Set<String> accepted = new HashSet<>();
        List<ConsumerRecord<String, String>> pending = new ArrayList<>();
        try (KafkaShareConsumer<String, String> c = new KafkaShareConsumer<>(props)) {
            c.subscribe(List.of(args[1]));
            // The idle clock starts with the first record: joining takes a while on a busy machine.
            long started = System.currentTimeMillis();
            long lastData = -1;
            long firstRecordMs = args.length > 7 ? Long.parseLong(args[7]) : 90_000;
            while (lastData < 0 ? System.currentTimeMillis() - started < firstRecordMs
                                : System.currentTimeMillis() - lastData < idleMs) {
                ConsumerRecords<String, String> recs = c.poll(Duration.ofMillis(200));
                for (ConsumerRecord<String, String> r : recs) {
                    lastData = System.currentTimeMillis();
                    int delivery = r.deliveryCount().orElse((short) -1);
                    String v = r.value();
                    if (v.endsWith("release") && delivery == 1) {
                        c.acknowledge(r, AcknowledgeType.RELEASE);
                    } else if (v.endsWith("reject")) {
                        c.acknowledge(r, AcknowledgeType.REJECT);
                        System.out.println("REJECT " + r.partition() + " " + r.offset() + " " + v + " " + delivery);
                    } else {
                        c.acknowledge(r, AcknowledgeType.ACCEPT);
                        pending.add(r);
                    }
                }
                long commitStarted = System.currentTimeMillis();
                Map<TopicIdPartition, Optional<KafkaException>> results = c.commitSync();
                if (!pending.isEmpty()) {
                    System.out.println("COMMIT " + commitStarted + " " + System.currentTimeMillis());
                }
                // a partition missing from the result was never confirmed (the client could not send it):
                // only an explicit success counts as accepted
                Map<Integer, String> failed = new HashMap<>();
                results.forEach((tp, err) -> failed.put(tp.partition(), err.map(e -> e.toString()).orElse(null)));
                for (ConsumerRecord<String, String> r : pending) {
                    String line = r.partition() + " " + r.offset() + " " + r.value() + " "
                        + r.deliveryCount().orElse((short) -1);
                    String err = failed.containsKey(r.partition()) ? failed.get(r.partition()) : "no result";
                    if (err == null) {
                        accepted.add(r.value());
                        System.out.println("ACCEPT " + line);
                    } else {
                        System.out.println("ACKFAIL " + line + " " + err.replace(' ', '_'));
                    }
                }
                pending.clear();
                if (!recs.isEmpty()) {
                    try { Thread.sleep(Long.parseLong(args[6])); } catch (InterruptedException e) { return; }
                }
                if (accepted.size() >= count) break;
            }
        }
        System.out.println("DONE " + accepted.size());
    }
}
