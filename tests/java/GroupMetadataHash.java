import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.lang.reflect.Proxy;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;

import com.dynatrace.hash4j.hashing.Hashing;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.coordinator.common.runtime.CoordinatorMetadataImage;
import org.apache.kafka.coordinator.group.Utils;

/**
 * Reference values for kbroker's group metadata hash (KIP-1101), computed by Kafka's own group coordinator code
 * (Utils.computeTopicHash, Utils.computeGroupHash) and hash4j. One request a line on stdin, one answer a line:
 *   bytes HEX                          -> XXH3-64 of the bytes (hash4j, as Kafka calls it)
 *   topic UUID NAME P0RACKS;P1RACKS... -> computeTopicHash (racks comma-separated, "-" for none; "" partitions: 0)
 *   group NAME=HASH ...                -> computeGroupHash
 * The metadata image is a proxy answering only what computeTopicHash asks: topicMetadata(name).
 */
public class GroupMetadataHash {
    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        String line;
        while ((line = in.readLine()) != null) {
            String[] f = line.split(" ", -1);
            switch (f[0]) {
                case "bytes":
                    System.out.println(Hashing.xxh3_64().hashStream().putBytes(hex(f.length > 1 ? f[1] : "")).getAsLong());
                    break;
                case "topic":
                    System.out.println(Utils.computeTopicHash(f[2], image(Uuid.fromString(f[1]), f[2], f[3])));
                    break;
                case "group":
                    Map<String, Long> hashes = new HashMap<>();
                    for (int i = 1; i < f.length; i++) {
                        if (f[i].isEmpty()) continue;
                        int eq = f[i].lastIndexOf('=');
                        hashes.put(f[i].substring(0, eq), Long.parseLong(f[i].substring(eq + 1)));
                    }
                    System.out.println(Utils.computeGroupHash(hashes));
                    break;
                default:
                    throw new IllegalArgumentException(line);
            }
            System.out.flush();
        }
    }

    static byte[] hex(String s) {
        byte[] out = new byte[s.length() / 2];
        for (int i = 0; i < out.length; i++) out[i] = (byte) Integer.parseInt(s.substring(2 * i, 2 * i + 2), 16);
        return out;
    }

    static CoordinatorMetadataImage image(Uuid id, String name, String racksSpec) {
        List<List<String>> racks = new ArrayList<>();
        if (!racksSpec.equals("")) {
            for (String p : racksSpec.split(";", -1)) {
                racks.add(p.equals("-") ? new ArrayList<>() : new ArrayList<>(Arrays.asList(p.split(","))));
            }
        }
        Object topic = Proxy.newProxyInstance(
            GroupMetadataHash.class.getClassLoader(),
            new Class<?>[] {CoordinatorMetadataImage.TopicMetadata.class},
            (proxy, method, margs) -> {
                switch (method.getName()) {
                    case "id": return id;
                    case "name": return name;
                    case "partitionCount": return racks.size();
                    // a copy: computeTopicHash sorts the list it is given
                    case "partitionRacks": return new ArrayList<>(racks.get((Integer) margs[0]));
                    default: throw new UnsupportedOperationException(method.getName());
                }
            });
        return (CoordinatorMetadataImage) Proxy.newProxyInstance(
            GroupMetadataHash.class.getClassLoader(),
            new Class<?>[] {CoordinatorMetadataImage.class},
            (proxy, method, margs) -> {
                if (method.getName().equals("topicMetadata") && margs.length == 1 && margs[0] instanceof String) {
                    return margs[0].equals(name) ? Optional.of(topic) : Optional.empty();
                }
                throw new UnsupportedOperationException(method.getName());
            });
    }
}
