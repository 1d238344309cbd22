import java.time.Duration;
import java.util.*;
import org.apache.kafka.clients.admin.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * The Java Admin (kafka-clients 3.9) describing a KIP-848 consumer group against kbroker.
 * Usage: GroupDescribeCompat BOOTSTRAP TOPIC GROUP PARTITIONS
 * Two members with group.protocol=consumer share the topic; describeConsumerGroups (ConsumerGroupDescribe, with
 * its DescribeGroups fallback for classic groups) must show the group Stable, of type CONSUMER, with both
 * members and every partition assigned. Prints "OK ..." per step and "DONE"; exits 1 on a failed check.
 */
public class GroupDescribeCompat {
    static void check(boolean cond, String what) {
        if (!cond) {
            System.out.println("FAIL " + what);
            System.out.flush();
            System.exit(1);
        }
    }

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], topic = args[1], group = args[2];
        int partitions = Integer.parseInt(args[3]);
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("group.id", group);
        p.put("group.protocol", "consumer");
        List<KafkaConsumer<byte[], byte[]>> members = List.of(
            new KafkaConsumer<>(p, new ByteArrayDeserializer(), new ByteArrayDeserializer()),
            new KafkaConsumer<>(p, new ByteArrayDeserializer(), new ByteArrayDeserializer()));
        for (KafkaConsumer<byte[], byte[]> c : members) c.subscribe(List.of(topic));
        long deadline = System.currentTimeMillis() + 60000;
        while (true) {
            for (KafkaConsumer<byte[], byte[]> c : members) c.poll(Duration.ofMillis(100));
            int a1 = members.get(0).assignment().size(), a2 = members.get(1).assignment().size();
            if (a1 > 0 && a2 > 0 && a1 + a2 == partitions) break;
            check(System.currentTimeMillis() < deadline, "partitions shared: " + a1 + " " + a2);
        }
        Properties ap = new Properties();
        ap.put("bootstrap.servers", bootstrap);
        try (Admin admin = Admin.create(ap)) {
            ConsumerGroupDescription d = admin.describeConsumerGroups(List.of(group)).all().get().get(group);
            int assigned = 0;
            for (MemberDescription m : d.members()) assigned += m.assignment().topicPartitions().size();
            System.out.println("OK described " + d.state() + " " + d.type() + " " + d.members().size() + " "
                + assigned + " " + d.partitionAssignor());
            for (KafkaConsumer<byte[], byte[]> c : members) c.close();
            // Once both left, the group is Empty and still of the consumer type.
            ConsumerGroupDescription e = admin.describeConsumerGroups(List.of(group)).all().get().get(group);
            System.out.println("OK empty " + e.state() + " " + e.type() + " " + e.members().size());
        }
        System.out.println("DONE");
    }
}
